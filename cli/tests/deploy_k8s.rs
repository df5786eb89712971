//! `halyard deploy k8s` (issue 34, item 6): the real binary writes an overlay for every
//! shipped example sweep; every pool of the sweep (read by Halyard's own parser) has a
//! Deployment serving it alone and a ScaledObject on its consumer
//! (`halyard_proto::subjects::pool_consumer`); GPU pools ask for GPUs, the others for
//! none; probes are split (/healthz liveness, /readyz readiness); no Secret is written;
//! `kubectl kustomize` renders it. Bad input is refused naming the file and key.
//! (deploy/check renders the same overlays and validates them against the schemas.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use halyard_plan::sweep;
use halyard_proto::subjects::{pool_consumer, JOBS_STREAM};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn halyard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_halyard")).args(args).current_dir(repo()).output().unwrap()
}

/// The secrets kustomization in a temporary copy, given check-only secret files.
fn secrets(tmp: &Path) -> PathBuf {
    let dir = tmp.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["kustomization.yaml", "namespace.yaml", "networkpolicy.yaml"] {
        std::fs::copy(repo().join("deploy/k8s/secrets").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("nats-credentials.env"),
        "coordinator-password=t1x\nworker-password=t2y\nstatus-password=t3z\n",
    )
    .unwrap();
    std::fs::write(dir.join("api-keys.env"), "OPENAI_API_KEY=test-only-key\n").unwrap();
    dir
}

/// The objects of a written file: JSON documents after `#` comments, split by `---`.
fn objects(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    text.split("\n---\n")
        .map(|doc| {
            let body: String =
                doc.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
            serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("{}: not a JSON document: {e}", file.display()))
        })
        .collect()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

fn flag_values(args: &[String], flag: &str) -> Vec<String> {
    args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].clone()).collect()
}

/// GPUs a pool needs, from the sweep: gguf models on a GPU 1, a managed server its `gpus`.
fn gpus_of(s: &sweep::Sweep, pool: &str) -> u64 {
    s.models
        .iter()
        .filter(|m| m.spec.pool == pool)
        .map(|m| match (&m.local, &m.server) {
            (Some(g), _) if g.gpu.is_some() => 1,
            (_, Some(sv)) => u64::from(sv.gpus),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The objects of the `.yaml` files of `dir` (not its kustomization or loaders).
fn dir_objects(dir: &Path) -> Vec<Value> {
    let mut docs = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yaml")
            && name != "kustomization.yaml"
            && name != "nats-auth-values.yaml"
            && !name.ends_with("-loader.yaml")
        {
            docs.extend(objects(&p));
        }
    }
    docs
}

fn check_overlay(sweep_file: &Path, out: &Path) -> usize {
    let s = sweep::load_pools(sweep_file).unwrap();
    let overlay = dir_objects(out);
    // Issue 46, item 8: `kubectl delete -k` of the overlay must not delete the namespace,
    // a Secret or a volume: none is in it.
    for d in &overlay {
        assert!(
            !["Namespace", "Secret", "PersistentVolumeClaim", "ScaledObject"]
                .contains(&d["kind"].as_str().unwrap()),
            "{}: the overlay holds a {}",
            sweep_file.display(),
            d["kind"]
        );
    }
    let volumes = dir_objects(&out.join("volumes"));
    let scaling = dir_objects(&out.join("scaling"));
    assert!(volumes.iter().all(|d| d["kind"] == "PersistentVolumeClaim"));
    assert!(scaling.iter().all(|d| d["kind"] == "ScaledObject"));
    let docs: Vec<Value> = overlay.into_iter().chain(volumes).chain(scaling).collect();
    let kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    assert_eq!(kind("Secret").count(), 0, "no Secret written: they come from deploy/k8s/secrets");
    let deployments: BTreeMap<String, &Value> =
        kind("Deployment").map(|d| (d["metadata"]["name"].as_str().unwrap().into(), d)).collect();
    let scaled: Vec<&Value> = kind("ScaledObject").collect();
    let where_ = sweep_file.display();
    // Every container's probes are split.
    for d in kind("Deployment").chain(kind("Job")) {
        let spec = &d["spec"]["template"]["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false, "{where_}: {}", d["metadata"]);
        for c in spec["containers"].as_array().unwrap() {
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{where_}: {c}");
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{where_}: {c}");
            assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz", "{where_}: {c}");
        }
    }
    let pools = s.pools();
    assert_eq!(deployments.len(), pools.len(), "{where_}: one Deployment per pool");
    assert_eq!(scaled.len(), pools.len(), "{where_}: one ScaledObject per pool");
    for pool in pools.keys() {
        let serving: Vec<(&String, &&Value)> = deployments
            .iter()
            .filter(|(_, d)| {
                let args = strs(&d["spec"]["template"]["spec"]["containers"][0]["args"]);
                flag_values(&args, "--only-pool") == [pool.clone()]
            })
            .collect();
        assert_eq!(serving.len(), 1, "{where_}: pool {pool}: one Deployment serves it alone");
        let (name, d) = serving[0];
        // Item 9: KEDA owns the count.
        assert!(d["spec"].get("replicas").is_none(), "{where_}: {name} sets replicas");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let args = strs(&c["args"]);
        assert_eq!(&args[..3], ["worker", "--sweep", "/halyard/sweep/sweep.toml"]);
        let so: Vec<&&Value> =
            scaled.iter().filter(|so| so["spec"]["scaleTargetRef"]["name"] == **name).collect();
        assert_eq!(so.len(), 1, "{where_}: pool {pool}: one ScaledObject scales {name}");
        assert_eq!(so[0]["spec"]["fallback"]["replicas"], 1, "{where_}: {name}: KEDA's fallback");
        let triggers = so[0]["spec"]["triggers"].as_array().unwrap();
        assert_eq!(triggers.len(), 1, "{where_}: pool {pool}");
        let md = &triggers[0]["metadata"];
        assert_eq!(triggers[0]["type"], "nats-jetstream");
        assert_eq!(md["stream"], JOBS_STREAM);
        assert_eq!(
            md["consumer"],
            pool_consumer(pool),
            "{where_}: pool {pool}: the worker's consumer"
        );
        // Issue 49: the pool's own broker user, with its own password key.
        let env = c["env"].as_array().unwrap();
        let var = |n: &str| env.iter().find(|e| e["name"] == n).unwrap().clone();
        assert_eq!(
            var("HALYARD_NATS_USER")["value"],
            halyard_broker::permissions::worker_user(pool),
            "{where_}: pool {pool}"
        );
        assert_eq!(
            var("HALYARD_NATS_PASSWORD")["valueFrom"]["secretKeyRef"]["key"],
            halyard_broker::permissions::worker_secret_key(pool),
            "{where_}: pool {pool}"
        );
        let lag: u64 = md["lagThreshold"].as_str().unwrap().parse().unwrap();
        assert!(lag >= 1);
        let want = gpus_of(&s, pool);
        let limits = &c["resources"]["limits"];
        let requests = &c["resources"]["requests"];
        if want > 0 {
            assert_eq!(
                limits["nvidia.com/gpu"], want,
                "{where_}: GPU pool {pool} asks for its GPUs"
            );
            assert_eq!(requests["nvidia.com/gpu"], want);
            let set: Vec<String> = (0..want).map(|g| g.to_string()).collect();
            assert_eq!(flag_values(&args, "--gpu"), [set.join(",")], "{where_}: pool {pool}");
            let env = c["env"].as_array().unwrap();
            assert!(env.iter().any(|e| e["name"] == "NVIDIA_DRIVER_CAPABILITIES"
                && e["value"].as_str().unwrap().contains("compute")));
            // Item 6: placed by the GPU request, no label of GPU Feature Discovery.
            assert!(
                d["spec"]["template"]["spec"].get("nodeSelector").is_none(),
                "{where_}: {name}"
            );
        } else {
            assert!(limits.get("nvidia.com/gpu").is_none(), "{where_}: {pool} asks for no GPU");
            assert!(requests.get("nvidia.com/gpu").is_none(), "{where_}: {pool} asks for no GPU");
            assert!(flag_values(&args, "--gpu").is_empty());
        }
    }
    // The coordinator: a Job with its PVC, reading the datasets from a PVC (no ConfigMap).
    let job = kind("Job").next().expect("the coordinator Job");
    let vols = job["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let claim = |v: &str| {
        vols.iter().find(|x| x["name"] == v).unwrap()["persistentVolumeClaim"]["claimName"].clone()
    };
    assert_eq!(claim("state"), "halyard-coordinator-state");
    assert_eq!(claim("datasets"), "halyard-datasets");
    let pvcs: Vec<&str> =
        kind("PersistentVolumeClaim").map(|d| d["metadata"]["name"].as_str().unwrap()).collect();
    assert!(pvcs.contains(&"halyard-coordinator-state") && pvcs.contains(&"halyard-datasets"));
    // Item 7: a disruption is no failure of the run, and no voluntary eviction mid-run.
    let rules = job["spec"]["podFailurePolicy"]["rules"].as_array().unwrap();
    assert!(rules
        .iter()
        .any(|r| r["action"] == "Ignore" && r["onPodConditions"][0]["type"] == "DisruptionTarget"));
    let pdb = kind("PodDisruptionBudget").next().expect("the coordinator's PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 0);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        job["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(kind("ConfigMap").count(), 0, "the sweep's ConfigMap is generated by kustomize");
    check_broker_users(sweep_file, out, pools.keys());
    pools.len()
}

/// Issue 49: the overlay's broker users are the coordinator, status and one worker user
/// per pool (none for every pool), the same in the Helm values and in
/// nats-permissions.conf, which a real nats-server accepts (`-t`) with every password
/// variable set, and refuses with one unset.
fn check_broker_users<'a>(sweep_file: &Path, out: &Path, pools: impl Iterator<Item = &'a String>) {
    check_broker_users_conf(sweep_file, out, &out.join("nats-permissions.conf"), pools)
}

/// [`check_broker_users`] with `conf` the configuration nats-server is given (the
/// generated file, or one that includes it).
fn check_broker_users_conf<'a>(
    sweep_file: &Path,
    out: &Path,
    conf: &Path,
    pools: impl Iterator<Item = &'a String>,
) {
    use halyard_broker::permissions::{worker_password_var, worker_user};
    let where_ = sweep_file.display();
    let values: Value = {
        let text = std::fs::read_to_string(out.join("nats-auth-values.yaml")).unwrap();
        let json: String =
            text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
        serde_json::from_str(&json).unwrap()
    };
    let users: Vec<String> = values["config"]["merge"]["authorization"]["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap().to_string())
        .collect();
    let mut want = vec!["halyard-coordinator".to_string(), "halyard-status".to_string()];
    let mut vars =
        vec!["HALYARD_COORDINATOR_PASSWORD".to_string(), "HALYARD_STATUS_PASSWORD".into()];
    for pool in pools {
        want.push(worker_user(pool));
        vars.push(worker_password_var(pool));
    }
    assert_eq!(users, want, "{where_}: the overlay's broker users");
    for v in &vars {
        assert!(
            values["container"]["env"].get(v).is_some(),
            "{where_}: the chart does not fill {v}"
        );
    }
    let server = |unset: Option<&str>| {
        let mut c = Command::new("nats-server");
        c.env("PATH", format!("{}:/usr/sbin", std::env::var("PATH").unwrap_or_default()));
        for v in &vars {
            if Some(v.as_str()) != unset {
                c.env(v, "check-only");
            } else {
                c.env_remove(v);
            }
        }
        c.args(["-t", "-c"]).arg(conf).output().expect("nats-server")
    };
    let ok = server(None);
    assert!(
        ok.status.success(),
        "{where_}: nats-server -t: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let last = vars.last().unwrap().clone();
    assert!(!server(Some(&last)).status.success(), "{where_}: nats-server started without {last}");
}

/// Every example sweep: written, checked, rendered by kubectl kustomize.
#[test]
fn every_example_sweep_gets_an_overlay_that_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let sec = secrets(tmp.path());
    let mut sweeps: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    sweeps.sort();
    assert!(sweeps.len() >= 8, "the shipped example sweeps");
    let mut gpu_pools = 0;
    let kubectl = Command::new("kubectl").arg("version").arg("--client").output().is_ok();
    for sweep_file in &sweeps {
        let name = sweep_file.file_stem().unwrap().to_string_lossy().into_owned();
        let out = tmp.path().join("gen").join(&name);
        let o = halyard(&[
            "deploy",
            "k8s",
            sweep_file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--secrets",
            sec.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        check_overlay(sweep_file, &out);
        let s = sweep::load_pools(sweep_file).unwrap();
        gpu_pools += s.pools().keys().filter(|p| gpus_of(&s, p) > 0).count();
        assert!(kubectl, "kubectl (with kustomize) is needed to render the overlays");
        let r = Command::new("kubectl").arg("kustomize").arg(&out).output().unwrap();
        let text = String::from_utf8_lossy(&r.stdout);
        assert!(
            r.status.success(),
            "{name}: kubectl kustomize: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(!text.contains("REPLACE-ME"), "{name}: a placeholder in the rendering");
        assert!(text.contains("name: halyard-sweep") && text.contains("halyard.dev/run: "));
    }
    assert!(gpu_pools >= 2, "the examples include GPU pools (examples/hypotermqa-k8s-gpu.toml)");
}

/// Files of a directory tree, relative to it, with their contents.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Issue 46, item 11: one deployment. The shipped overlays deploy/k8s/overlays/api-only and
/// gpu are, file for file, what `halyard deploy k8s` writes for their example sweeps (run
/// from the repository root with `--secrets deploy/k8s/secrets`, as their headers say):
/// a change to the generator that is not regenerated into them, or a hand edit to them,
/// fails here. Regenerate with the command of docs/src/operations/kubernetes.md.
#[test]
fn shipped_overlays_are_what_deploy_k8s_writes() {
    let tmp = tempfile::tempdir().unwrap();
    // The same layout as the repository's: overlays/NAME beside secrets/.
    let root = tmp.path().join("k8s");
    let sec = secrets(&root);
    for (overlay, example) in [
        ("api-only", "examples/hypotermqa-k8s-api.toml"),
        ("gpu", "examples/hypotermqa-k8s-gpu.toml"),
    ] {
        let out = root.join("overlays").join(overlay);
        let o = halyard(&[
            "deploy",
            "k8s",
            example,
            "--out",
            out.to_str().unwrap(),
            "--secrets",
            sec.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{example}: {}", String::from_utf8_lossy(&o.stderr));
        let shipped = tree(&repo().join("deploy/k8s/overlays").join(overlay));
        let written = tree(&out);
        let names = |t: &BTreeMap<String, Vec<u8>>| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&shipped), names(&written), "deploy/k8s/overlays/{overlay}: files");
        for (f, body) in &written {
            assert!(
                shipped[f] == *body,
                "deploy/k8s/overlays/{overlay}/{f} is not what `halyard deploy k8s {example}` writes"
            );
        }
    }
}

/// Bad input is refused, naming the file and key; nothing half-written is trusted.
#[test]
fn bad_input_is_refused_naming_what() {
    let tmp = tempfile::tempdir().unwrap();
    let sec = secrets(tmp.path());
    let out = tmp.path().join("out");
    let run = |sweep: &Path, extra: &[&str]| {
        let mut args = vec![
            "deploy",
            "k8s",
            sweep.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--secrets",
            sec.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = halyard(&args);
        assert!(!o.status.success(), "{}: accepted", sweep.display());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // Unreadable sweep.
    let missing = tmp.path().join("nope.toml");
    assert!(run(&missing, &[]).contains("nope.toml"));
    // A sweep in examples/ style, with one thing wrong each.
    let dir = tmp.path().join("examples");
    std::fs::create_dir_all(&dir).unwrap();
    let api = |pool: &str, extra: &str| {
        format!(
            "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"https://x/v1\"\nmodel = \"g\"\npool = \"{pool}\"\n{extra}\n[[model]]\nname = \"n\"\nbackend = \"noop\"\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"n\"]\n"
        )
    };
    let long = dir.join("long.toml");
    std::fs::write(&long, api(&"p".repeat(60), "")).unwrap();
    let e = run(&long, &[]);
    assert!(
        e.contains("long.toml") && e.contains(&"p".repeat(60)) && e.contains("more than 48"),
        "{e}"
    );
    let gpu1 = dir.join("gpu1.toml");
    std::fs::write(
        &gpu1,
        "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"gguf\"\nmodel_path = \"../models/m.gguf\"\nidentity = \"gguf:m.gguf:1:0123456789abcdef\"\ngpu = 1\n[[model]]\nname = \"n\"\nbackend = \"noop\"\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"n\"]\n",
    )
    .unwrap();
    let e = run(&gpu1, &[]);
    assert!(e.contains("gpu1.toml") && e.contains("model[0].gpu"), "{e}");
    let abs = dir.join("abs.toml");
    std::fs::write(
        &abs,
        "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"gguf\"\nmodel_path = \"/opt/m.gguf\"\nidentity = \"gguf:m.gguf:1:0123456789abcdef\"\n[[model]]\nname = \"n\"\nbackend = \"noop\"\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"n\"]\n",
    )
    .unwrap();
    let e = run(&abs, &[]);
    assert!(
        e.contains("abs.toml")
            && e.contains("model[0].model_path")
            && e.contains("/halyard/models"),
        "{e}"
    );
    // A good sweep, but --out is not empty: refused without --force, replaced with it.
    let good = dir.join("good.toml");
    std::fs::write(&good, api("openai-x", "rpm = 600")).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("mine.txt"), "x").unwrap();
    assert!(run(&good, &[]).contains("not empty"));
    assert!(run(&good, &["--force"]).contains("not one `halyard deploy k8s` wrote"));
    std::fs::remove_file(out.join("mine.txt")).unwrap();
    let ok = halyard(&[
        "deploy",
        "k8s",
        good.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--secrets",
        sec.to_str().unwrap(),
    ]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(check_overlay(&good, &out), 2, "openai-x and the noop pool");
    let again = halyard(&[
        "deploy",
        "k8s",
        good.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--secrets",
        sec.to_str().unwrap(),
        "--force",
    ]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
}

/// Issue 49: `halyard deploy nats-permissions SWEEP --out DIR` writes the broker's users
/// for a sweep without an overlay: the same `nats-permissions.conf` and
/// `nats-auth-values.yaml` as `halyard deploy k8s` (but for the generator's name in the
/// header), one worker user per pool; a nats-server configuration that includes the file
/// passes `nats-server -t` with every password variable set and fails with one unset;
/// files already there are refused unless --force.
#[test]
fn nats_permissions_alone_writes_the_users_of_every_pool() {
    use halyard_broker::permissions::{worker_password_var, worker_user};
    let tmp = tempfile::tempdir().unwrap();
    let sweep_file = tmp.path().join("three.toml");
    let pools = ["free", "paid-tier", "judges_2"];
    let mut text = String::from("name = \"three\"\n");
    for (i, pool) in pools.iter().enumerate() {
        text.push_str(&format!(
            "\n[[model]]\nname = \"m{i}\"\nbackend = \"noop\"\npool = \"{pool}\"\n"
        ));
    }
    text.push_str(
        "\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"m0\", \"m1\", \"m2\"]\n",
    );
    std::fs::write(&sweep_file, text).unwrap();
    let out = tmp.path().join("auth");
    let args = ["deploy", "nats-permissions", sweep_file.to_str().unwrap(), "--out"];
    let o = halyard(&[&args[..], &[out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8_lossy(&o.stdout);
    for f in ["nats-permissions.conf", "nats-auth-values.yaml"] {
        assert!(listed.contains(&out.join(f).display().to_string()), "{f} not listed: {listed}");
    }
    let conf = std::fs::read_to_string(out.join("nats-permissions.conf")).unwrap();
    assert!(conf.contains("Generated by `halyard deploy nats-permissions`"), "{conf}");
    let mut sorted = pools.map(String::from).to_vec();
    sorted.sort();
    for pool in &sorted {
        let user = worker_user(pool);
        assert!(conf.contains(&format!("\"user\": \"{user}\"")), "no {user} in\n{conf}");
        assert!(conf.contains(&format!("${}", worker_password_var(pool))), "{conf}");
    }
    assert!(!conf.contains("\"halyard-worker\""), "a worker user for every pool:\n{conf}");
    // The users a real nats-server reads from a configuration including the file.
    std::fs::write(
        out.join("server.conf"),
        "listen: 127.0.0.1:-1\njetstream: enabled\ninclude \"nats-permissions.conf\"\n",
    )
    .unwrap();
    let server_conf = out.join("server.conf");
    check_broker_users_conf(&sweep_file, &out, &server_conf, sorted.iter());

    // The same files as `halyard deploy k8s` writes beside its overlay.
    let sec = secrets(tmp.path());
    let overlay = tmp.path().join("overlay");
    let o = halyard(&[
        "deploy",
        "k8s",
        sweep_file.to_str().unwrap(),
        "--out",
        overlay.to_str().unwrap(),
        "--secrets",
        sec.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["nats-permissions.conf", "nats-auth-values.yaml"] {
        let alone = std::fs::read_to_string(out.join(f)).unwrap();
        let k8s = std::fs::read_to_string(overlay.join(f)).unwrap();
        assert_eq!(
            alone.replace("`halyard deploy nats-permissions`", "`halyard deploy k8s`"),
            k8s,
            "{f}"
        );
    }

    // Files already there: refused unless --force, and then replaced.
    std::fs::write(out.join("nats-auth-values.yaml"), "# mine\n").unwrap();
    let o = halyard(&[&args[..], &[out.to_str().unwrap()]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(out.join("nats-auth-values.yaml")).unwrap(), "# mine\n");
    let o = halyard(&[&args[..], &[out.to_str().unwrap(), "--force"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(out.join("nats-auth-values.yaml"))
        .unwrap()
        .contains("halyard-worker-free"));
}
