//! Which managed servers a worker given GPU sets runs (`halyard worker --gpu 0,1 --gpu
//! 2,3`).
//!
//! Each GPU set runs one server. The sets are dealt, in the order given, to the plan's
//! GPU server models (`gpus >= 1`) whose `gpus` equals the set's size, in plan order,
//! round robin: one model and two sets of its size make two servers of that model (its
//! pool then takes twice the model's `max_concurrency`); two models and two sets make
//! one server each. A set that fits no model is an error, as is a set given twice or
//! sets that share a GPU: two servers would fight over its memory.

use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_proto::server::gpu_list;

/// Parse one `--gpu` value: `N` or `N,M,...`.
pub fn parse_gpu_set(s: &str) -> Result<Vec<u32>, String> {
    let mut set = Vec::new();
    for part in s.split(',') {
        let n: u32 = part.trim().parse().map_err(|_| {
            format!("--gpu {s:?}: {part:?} is not a GPU index (give N, or a set N,M,...)")
        })?;
        if n > 63 {
            return Err(format!("--gpu {s:?}: GPU {n} is outside 0..=63"));
        }
        if set.contains(&n) {
            return Err(format!("--gpu {s:?}: GPU {n} is named twice"));
        }
        set.push(n);
    }
    Ok(set)
}

/// Check that `sets` share no GPU.
pub fn check_disjoint(sets: &[Vec<u32>]) -> Result<(), String> {
    for (i, a) in sets.iter().enumerate() {
        for b in &sets[i + 1..] {
            if let Some(g) = a.iter().find(|g| b.contains(g)) {
                return Err(format!(
                    "--gpu {} and --gpu {} share GPU {g}: each set runs its own server",
                    gpu_list(a),
                    gpu_list(b)
                ));
            }
        }
    }
    Ok(())
}

/// The plan of the GPU servers of `plan` dealt to `sets` (see the module docs): each
/// dealt model with its `gpu_sets`, in its pools, whose concurrency is the model's
/// times its servers. Models dealt no set are left out.
pub fn place_servers(plan: &WorkerPlan, sets: &[Vec<u32>]) -> Result<WorkerPlan, String> {
    // The GPU server models, by endpoint, in plan order.
    let mut models: Vec<halyard_proto::server::ServerSpec> = Vec::new();
    for (_, m) in plan.models() {
        if let WorkerModel::Server(s) = m {
            if s.gpus > 0 && !models.iter().any(|have| have.endpoint == s.endpoint) {
                models.push(s.clone());
            }
        }
    }
    let mut dealt_of_size = std::collections::HashMap::<usize, usize>::new();
    for set in sets {
        let fits: Vec<usize> =
            (0..models.len()).filter(|&i| models[i].gpus as usize == set.len()).collect();
        if fits.is_empty() {
            if models.is_empty() {
                // No server model at all: the set is for gguf models (checked by the caller).
                continue;
            }
            let sizes: Vec<String> =
                models.iter().map(|m| format!("{} ({} GPUs)", m.name, m.gpus)).collect();
            return Err(format!(
                "--gpu {}: no managed server of the sweep takes {} GPU(s); its servers: {}",
                gpu_list(set),
                set.len(),
                sizes.join(", ")
            ));
        }
        let n = dealt_of_size.entry(set.len()).or_default();
        models[fits[*n % fits.len()]].gpu_sets.push(set.clone());
        *n += 1;
    }
    let mut out = WorkerPlan::default();
    for p in &plan.pools {
        let mut kept = PoolPlan { models: Vec::new(), ..p.clone() };
        let mut servers = 0usize;
        for m in &p.models {
            if let WorkerModel::Server(s) = m {
                if let Some(placed) =
                    models.iter().find(|x| x.endpoint == s.endpoint && !x.gpu_sets.is_empty())
                {
                    servers += placed.gpu_sets.len();
                    kept.models.push(WorkerModel::Server(placed.clone()));
                }
            }
        }
        if !kept.models.is_empty() {
            kept.pool.concurrency = p.pool.concurrency.saturating_mul(servers.max(1));
            out.pools.push(kept);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::server::ServerSpec;

    fn spec(name: &str, gpus: u32) -> WorkerModel {
        WorkerModel::Server(ServerSpec {
            endpoint: format!("server:vllm:{name}:r:-:0"),
            name: name.into(),
            kind: "vllm".into(),
            command: vec!["vllm".into(), "{port}".into()],
            model_path: "/m".into(),
            served_name: name.into(),
            gpus,
            ready_path: "/health".into(),
            version_path: None,
            version_field: "version".into(),
            version: None,
            start_timeout_ms: 1000,
            max_restarts: 1,
            restart_backoff_ms: 100,
            stable_ms: 1000,
            gpu_sets: Vec::new(),
        })
    }

    fn plan(models: &[(&str, u32)]) -> WorkerPlan {
        let mut p = WorkerPlan::default();
        for (name, gpus) in models {
            p.add(PoolPlan::new(format!("server/{name}"), 8).with_model(spec(name, *gpus)))
                .unwrap();
        }
        p.add(PoolPlan::new("cpu", 2).with_model(spec("small", 0))).unwrap();
        p
    }

    fn sets_of(p: &WorkerPlan, pool: &str) -> (usize, Vec<Vec<u32>>) {
        let pp = p.pool(pool).unwrap();
        match &pp.models[0] {
            WorkerModel::Server(s) => (pp.pool.concurrency, s.gpu_sets.clone()),
            _ => unreachable!(),
        }
    }

    /// One model, two sets: two servers of it, twice the concurrency; CPU servers are
    /// not a GPU worker's.
    #[test]
    fn sets_make_replicas() {
        let p = place_servers(&plan(&[("big", 2)]), &[vec![0, 1], vec![2, 3]]).unwrap();
        assert_eq!(sets_of(&p, "server/big"), (16, vec![vec![0, 1], vec![2, 3]]));
        assert!(p.pool("cpu").is_none());
    }

    /// Two models of the same size share the sets out; sizes pick their models.
    #[test]
    fn sets_are_dealt() {
        let full = plan(&[("a", 2), ("b", 2), ("c", 1)]);
        let p = place_servers(&full, &[vec![0, 1], vec![2, 3], vec![4]]).unwrap();
        assert_eq!(sets_of(&p, "server/a"), (8, vec![vec![0, 1]]));
        assert_eq!(sets_of(&p, "server/b"), (8, vec![vec![2, 3]]));
        assert_eq!(sets_of(&p, "server/c"), (8, vec![vec![4]]));
        let one = place_servers(&full, &[vec![0, 1]]).unwrap();
        assert!(one.pool("server/b").is_none() && one.pool("server/c").is_none());
    }

    /// Mistakes are errors naming the flag.
    #[test]
    fn mistakes_are_named() {
        let e = place_servers(&plan(&[("a", 2)]), &[vec![0, 1, 2]]).unwrap_err();
        assert!(e.contains("--gpu 0,1,2") && e.contains("a (2 GPUs)"), "{e}");
        assert!(check_disjoint(&[vec![0, 1], vec![1, 2]]).unwrap_err().contains("share GPU 1"));
        assert!(parse_gpu_set("0,x").unwrap_err().contains("\"x\""));
        assert!(parse_gpu_set("1,1").unwrap_err().contains("twice"));
        assert_eq!(parse_gpu_set("2, 3").unwrap(), [2, 3]);
    }
}
