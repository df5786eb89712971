//! What a worker serving a sweep runs: the sweep's pools, each with its quota and the
//! models it may call ([`halyard_proto::pool::WorkerPlan`]). `halyard run`, `halyard
//! worker --sweep` and the benchmarks build their workers' plans here, and nowhere else.

use halyard_proto::pool::{EmbedSpec, HttpModelSpec, PoolPlan, WorkerModel, WorkerPlan};

use crate::sweep::{Model, Sweep};

/// The plan of a worker serving every pool and model of `s`.
pub fn worker_plan(s: &Sweep) -> WorkerPlan {
    let mut plan = WorkerPlan::default();
    for m in &s.models {
        let mut p = PoolPlan::new(&m.spec.pool, m.max_concurrency).with_model(worker_model(m));
        p.quota = s.quotas.get(&m.spec.pool).copied();
        p.batch = m.batch;
        // The sweep gives one quota per pool (checked when it was read), so no conflict.
        let _ = plan.add(p);
    }
    plan
}

/// The plan of a worker pinned to GPU `gpu`: only the local models the sweep places
/// there, and their pools.
pub fn gpu_plan(plan: &WorkerPlan, gpu: u32) -> WorkerPlan {
    let on_gpu = |m: &WorkerModel| matches!(m, WorkerModel::Gguf(g) if g.gpu == Some(gpu));
    let pools = plan
        .pools
        .iter()
        .filter(|p| p.models.iter().any(on_gpu))
        .map(|p| PoolPlan {
            models: p.models.iter().filter(|m| on_gpu(m)).cloned().collect(),
            ..p.clone()
        })
        .collect();
    WorkerPlan { pools }
}

/// The plan of a worker started without `--gpu`: every model except the local models the
/// sweep places on a GPU, and the pools left with a model (issue 34). Such a worker (an API
/// worker, a CPU node) never loads a GPU model it could not run, and the GPU workers of a
/// deployment serve those.
pub fn non_gpu_plan(plan: &WorkerPlan) -> WorkerPlan {
    // A managed server on GPUs (`gpus >= 1`) is for workers given GPU sets, too.
    let on_a_gpu = |m: &WorkerModel| match m {
        WorkerModel::Gguf(g) => g.gpu.is_some(),
        WorkerModel::Server(s) => s.gpus > 0,
        _ => false,
    };
    let pools = plan
        .pools
        .iter()
        .filter(|p| p.models.iter().any(|m| !on_a_gpu(m)))
        .map(|p| PoolPlan {
            models: p.models.iter().filter(|m| !on_a_gpu(m)).cloned().collect(),
            ..p.clone()
        })
        .collect();
    WorkerPlan { pools }
}

fn worker_model(m: &Model) -> WorkerModel {
    let r = &m.spec.model_ref;
    if let Some(l) = &m.local {
        return WorkerModel::Gguf(l.clone());
    }
    if let Some(rp) = &m.replay {
        return WorkerModel::Replay(rp.clone());
    }
    if let Some(s) = &m.server {
        return WorkerModel::Server(s.clone());
    }
    if let Some(path) = &m.embed {
        return WorkerModel::Embed(EmbedSpec { endpoint: r.endpoint.clone(), path: path.clone() });
    }
    match r.backend.as_str() {
        "noop" => WorkerModel::Noop,
        _ => WorkerModel::Http(HttpModelSpec {
            backend: r.backend.clone(),
            base_url: r.endpoint.clone(),
            model: r.model.clone(),
            api_key_env: m.spec.api_key_env.clone(),
            prompt_cache: m.prompt_cache,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 13: every model of a sweep lands in its pool with its quota, and an HTTP
    /// model carries the sweep's key variable (which jobs no longer carry).
    #[test]
    fn a_sweep_becomes_a_plan() {
        let dir = tempfile::tempdir().unwrap();
        let text = "name = \"t\"\n\
            [[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"https://x/v1\"\nmodel = \"m\"\napi_key_env = \"K\"\npool = \"p\"\nrpm = 60\nmax_concurrency = 3\n\
            [[model]]\nname = \"b\"\nbackend = \"openai\"\nbase_url = \"https://y/v1\"\nmodel = \"n\"\npool = \"p\"\nmax_concurrency = 5\n\
            [[model]]\nname = \"c\"\nbackend = \"noop\"\n\
            [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"c\"]\n";
        let s = crate::sweep::parse(&dir.path().join("s.toml"), text).unwrap();
        let plan = worker_plan(&s);
        let p = plan.pool("p").unwrap();
        assert_eq!(p.pool.concurrency, 5);
        assert_eq!(
            p.quota,
            Some(halyard_proto::pool::QuotaSpec {
                rpm: Some(60),
                tpm: None,
                burst: 1,
                tpm_counts: Default::default(),
                itpm: None,
                otpm: None,
            })
        );
        assert_eq!(p.models.len(), 2);
        assert!(
            matches!(&p.models[0], WorkerModel::Http(h) if h.api_key_env.as_deref() == Some("K") && h.base_url == "https://x/v1")
        );
        assert_eq!(plan.pool("c").unwrap().models, [WorkerModel::Noop]);
        assert!(gpu_plan(&plan, 0).pools.is_empty());
    }

    /// A worker pinned to a GPU keeps only the pools of models placed there, and in
    /// them only those models.
    #[test]
    fn gpu_plans_keep_their_gpu() {
        let gguf = |endpoint: &str, gpu: Option<u32>| {
            WorkerModel::Gguf(halyard_proto::pool::GgufSpec {
                endpoint: endpoint.into(),
                path: "m.gguf".into(),
                gpu,
                gpu_layers: 99,
                slots: 2,
                threads: 0,
                ctx_size: 1024,
            })
        };
        let plan = WorkerPlan {
            pools: vec![
                PoolPlan::new("a@gpu1", 2)
                    .with_model(gguf("x", Some(1)))
                    .with_model(gguf("y", None)),
                PoolPlan::new("b@gpu0", 2).with_model(gguf("z", Some(0))),
                PoolPlan::new("c", 2).with_model(WorkerModel::Noop),
            ],
        };
        // Issue 34: a worker without --gpu serves everything not placed on a GPU.
        let cpu = non_gpu_plan(&plan);
        let names: Vec<&str> = cpu.pools.iter().map(|p| p.pool.name.as_str()).collect();
        assert_eq!(names, ["a@gpu1", "c"], "b@gpu0 holds only a GPU model");
        assert_eq!(&cpu.pools[0].models[..], &[gguf("y", None)][..]);
        let g1 = gpu_plan(&plan, 1);
        assert_eq!(g1.pools.len(), 1);
        assert_eq!(
            (g1.pools[0].pool.name.as_str(), &g1.pools[0].models[..]),
            ("a@gpu1", &[gguf("x", Some(1))][..])
        );
    }
}
