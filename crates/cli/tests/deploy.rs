//! The container and Kubernetes files agree with the server they deploy: the Dockerfile
//! (`Dockerfile`) and the manifests (`deploy/kubernetes/frink.yaml`) are read and checked
//! against `frink serve`'s flags, port and health path. No Docker, cluster or network.

mod common;

use common::frink;
use serde_json::Value;

fn repo(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The environment variables `frink serve` reads (its help lists each as `[env: NAME=…]`),
/// and the store's `FRINK_HOME`.
fn serve_env() -> Vec<String> {
    let out = frink(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut names: Vec<String> = help
        .split("[env: ")
        .skip(1)
        .map(|s| s.split(['=', ']']).next().unwrap().to_string())
        .collect();
    names.push("FRINK_HOME".into());
    assert!(names.contains(&"FRINK_PORT".to_string()), "{help}");
    names
}

/// The default port of `frink serve`.
fn default_port() -> u64 {
    let out = frink(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let port = help.split("--port <PORT>").nth(1).unwrap();
    let d = port.split("[default: ").nth(1).unwrap();
    d.split(']').next().unwrap().parse().unwrap()
}

#[test]
fn the_dockerfile_builds_the_release_binary_and_serves_on_the_default_port() {
    let d = repo("Dockerfile");
    let lines: Vec<&str> = d
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    assert!(
        froms.last().unwrap().contains("slim"),
        "slim runtime base: {froms:?}"
    );
    assert!(
        d.contains("cargo build --release --locked"),
        "locked release build"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("COPY --from=") && l.contains("target/release/frink")),
        "the release binary copied into the runtime stage"
    );
    let port = default_port();
    assert!(
        lines.contains(&format!("EXPOSE {port}").as_str()),
        "EXPOSE {port}"
    );
    let env = serve_env();
    let mut set = Vec::new();
    for l in d.lines() {
        for word in l.split_whitespace() {
            if let Some((k, v)) = word.trim_end_matches('\\').split_once('=') {
                if k.starts_with("FRINK_") {
                    assert!(
                        env.contains(&k.to_string()),
                        "{k} is no variable frink reads"
                    );
                    set.push((k.to_string(), v.to_string()));
                }
            }
        }
    }
    let get = |k: &str| set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("FRINK_HOST"), Some("0.0.0.0"));
    assert_eq!(get("FRINK_PORT"), Some(port.to_string().as_str()));
    let home = get("FRINK_HOME").expect("FRINK_HOME");
    assert!(
        d.contains(&format!("VOLUME [\"{home}\"]")),
        "models in a volume at {home}"
    );
    let health = lines
        .iter()
        .find(|l| l.starts_with("HEALTHCHECK"))
        .expect("HEALTHCHECK");
    let check = d.split("HEALTHCHECK").nth(1).unwrap();
    assert!(
        check.contains("/health") && check.contains(&format!("/{port}")),
        "{health}"
    );
    assert!(lines.contains(&"ENTRYPOINT [\"frink\"]"));
    assert!(lines.contains(&"CMD [\"serve\"]"));
}

#[test]
fn the_kubernetes_manifests_agree_with_the_server() {
    let text = repo("deploy/kubernetes/frink.yaml");
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    for d in &docs {
        assert!(
            d["apiVersion"].is_string() && d["metadata"]["name"].is_string(),
            "{d}"
        );
    }
    let dep = kind("Deployment");
    assert_eq!(dep["apiVersion"], "apps/v1");
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&dep["spec"]["selector"]["matchLabels"], labels);
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][0], "serve");
    let env = serve_env();
    let mut vars = std::collections::HashMap::new();
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        assert!(
            env.contains(&name.to_string()),
            "{name} is no variable frink reads"
        );
        vars.insert(name.to_string(), e["value"].as_str().unwrap().to_string());
    }
    assert_eq!(vars["FRINK_HOST"], "0.0.0.0");
    let port: u64 = vars["FRINK_PORT"].parse().unwrap();
    let http = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http")
        .unwrap();
    assert_eq!(http["containerPort"], port);
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/health", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "http", "{probe}");
    }
    let mount = &c["volumeMounts"][0];
    assert_eq!(
        mount["mountPath"].as_str(),
        Some(vars["FRINK_HOME"].as_str())
    );
    let vol = &dep["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(vol["name"], mount["name"]);
    assert_eq!(
        vol["persistentVolumeClaim"]["claimName"],
        kind("PersistentVolumeClaim")["metadata"]["name"]
    );
    let svc = kind("Service");
    assert_eq!(&svc["spec"]["selector"], labels);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    let pool = kind("InferencePool");
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    assert_eq!(&pool["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(pool["spec"]["targetPorts"][0]["number"], port);
    assert!(pool["spec"]["endpointPickerRef"]["name"].is_string());
    let route = kind("HTTPRoute");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["name"], pool["metadata"]["name"]);
    // The README's metric names are the ones /metrics exports (checked against the server
    // in tests/serve.rs, vllm_metrics_report_running_requests_and_kv_use).
    let readme = repo("deploy/kubernetes/README.md");
    for m in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ] {
        assert!(readme.contains(m), "{m}");
    }
}
