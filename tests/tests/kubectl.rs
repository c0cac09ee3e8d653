//! kubectl, an independent and real Kubernetes client, against the test
//! API server: if kubectl cannot tell it from a real cluster for nodes,
//! services, events and leases, neither can our controllers.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kube_test_apiserver::ApiServer;
use serde_json::Value;

struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(server: &ApiServer) -> Self {
        Self::with(server, PathBuf::from("kubectl"))
    }

    /// A kubectl of another version, e.g. `kubectl.1.27`.
    fn with(server: &ApiServer, binary: PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Self {
            binary,
            kubeconfig,
            _dir: dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "20s"])
            .args(args)
            .env("KUBECACHEDIR", self._dir.path().join("cache"));
        cmd
    }

    /// Runs kubectl (optionally with `stdin`), returning stdout; panics with
    /// stderr on failure.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (code, out, err) = self.try_run(args, stdin);
        assert_eq!(code, 0, "kubectl {args:?} failed:\n{err}");
        out
    }

    fn try_run(&self, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl is installed");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&all, None)).unwrap()
    }
}

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {tier: a}
spec:
  podCIDR: 10.244.1.0/24
  taints:
  - {key: node.cloudprovider.kubernetes.io/uninitialized, value: "true", effect: NoSchedule}
status:
  conditions:
  - {type: Ready, status: "True", reason: KubeletReady}
  addresses:
  - {type: InternalIP, address: 10.0.0.1}
  - {type: Hostname, address: node-1}
"#;

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{name: http, port: 80}]
"#;

/// kubectl blocks; keep it off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(f))
        .await
        .expect("kubectl finished in time")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_and_reapplies_nodes_and_services() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        assert!(
            k.run(&["apply", "-f", "-"], Some(NODE))
                .contains("node/node-1 created")
        );
        assert!(
            k.run(&["apply", "-f", "-"], Some(SERVICE))
                .contains("service/web created")
        );

        let node = k.json(&["get", "node", "node-1"]);
        assert_eq!(node["kind"], "Node");
        assert_eq!(node["metadata"]["labels"]["tier"], "a");
        assert!(
            node["metadata"]["uid"]
                .as_str()
                .is_some_and(|u| u.len() == 36)
        );
        assert!(
            node["metadata"]["creationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        assert_eq!(node["status"]["addresses"][0]["address"], "10.0.0.1");

        let svc = k.json(&["get", "svc", "web"]);
        assert_eq!(svc["spec"]["type"], "LoadBalancer");
        let node_port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert!(
            (30000..=32767).contains(&node_port),
            "the server allocates node ports"
        );
        assert!(svc["spec"]["clusterIP"].as_str().is_some());

        // A changed manifest applies as a three-way patch.
        let changed = NODE.replace("tier: a", "tier: b");
        assert!(
            k.run(&["apply", "-f", "-"], Some(&changed))
                .contains("configured")
        );
        let node = k.json(&["get", "node", "node-1"]);
        assert_eq!(node["metadata"]["labels"]["tier"], "b");
        assert_eq!(node["metadata"]["generation"], 1, "labels are not spec");

        // Server-side printing: the columns of a real server.
        let wide = k.run(&["get", "nodes,svc", "-o", "wide"], None);
        for column in [
            "STATUS",
            "INTERNAL-IP",
            "10.0.0.1",
            "TYPE",
            "EXTERNAL-IP",
            "<pending>",
            "80:",
        ] {
            assert!(wide.contains(column), "{column} missing:\n{wide}");
        }
        let list = k.json(&["get", "nodes"]);
        assert_eq!(list["items"].as_array().unwrap().len(), 1);
        let names = k.run(&["get", "nodes,svc", "-A", "-o", "name"], None);
        assert!(
            names.contains("node/node-1") && names.contains("service/web"),
            "{names}"
        );
        // Unknown fields are refused when kubectl asks for strict checks.
        let bad = NODE.replace("podCIDR:", "podCIDRR:");
        let (code, _, err) = k.try_run(&["apply", "-f", "-", "--validate=strict"], Some(&bad));
        assert_ne!(code, 0);
        assert!(err.contains("unknown field \"spec.podCIDRR\""), "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patches_labels_and_taints() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        k.run(&["apply", "-f", "-"], Some(NODE));
        k.run(&["patch", "node", "node-1", "--type", "merge", "-p", r#"{"metadata":{"labels":{"m":"1"}}}"#], None);
        k.run(
            &["patch", "node", "node-1", "--type", "json", "-p",
              r#"[{"op":"test","path":"/metadata/labels/m","value":"1"},{"op":"add","path":"/metadata/labels/j","value":"2"}]"#],
            None,
        );
        let (code, _, _) = k.try_run(
            &["patch", "node", "node-1", "--type", "json", "-p", r#"[{"op":"test","path":"/metadata/labels/m","value":"no"}]"#],
            None,
        );
        assert_ne!(code, 0, "a failed JSON patch test changes nothing");
        // Strategic merge of conditions by type, through the status subresource.
        k.run(
            &["patch", "node", "node-1", "--subresource", "status", "--type", "strategic", "-p",
              r#"{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"RouteCreated"}]}}"#],
            None,
        );
        k.run(&["label", "node", "node-1", "zone=z1"], None);
        k.run(&["taint", "node", "node-1", "node.cloudprovider.kubernetes.io/uninitialized-"], None);
        k.run(&["taint", "node", "node-1", "dedicated=ccm:NoSchedule"], None);

        let node = k.json(&["get", "node", "node-1"]);
        let labels = &node["metadata"]["labels"];
        assert_eq!((labels["m"].as_str(), labels["j"].as_str(), labels["zone"].as_str()), (Some("1"), Some("2"), Some("z1")));
        let conditions: Vec<&str> = node["status"]["conditions"]
            .as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(conditions, ["Ready", "NetworkUnavailable"]);
        let taints = node["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0]["key"], "dedicated");
        assert_eq!(node["metadata"]["generation"], 3, "each taint change is a spec change");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_waits_for_finalizers() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        k.run(&["apply", "-f", "-"], Some(SERVICE));
        k.run(
            &[
                "patch",
                "svc",
                "web",
                "--type",
                "merge",
                "-p",
                r#"{"metadata":{"finalizers":["service.kubernetes.io/load-balancer-cleanup"]}}"#,
            ],
            None,
        );
        k.run(&["delete", "svc", "web", "--wait=false"], None);
        let svc = k.json(&["get", "svc", "web"]);
        assert!(svc["metadata"]["deletionTimestamp"].is_string(), "{svc}");
        k.run(
            &[
                "patch",
                "svc",
                "web",
                "--type",
                "json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ],
            None,
        );
        let (code, _, err) = k.try_run(&["get", "svc", "web"], None);
        assert_ne!(code, 0);
        assert!(
            err.contains("NotFound") || err.contains("not found"),
            "{err}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_wait_and_watch_see_changes_as_they_happen() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let kubeconfig = k.kubeconfig.clone();
    blocking(move || {
        k.run(&["apply", "-f", "-"], Some(NODE));
        let mut watch = k
            .command(&["get", "nodes", "-w", "-o", "name"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut waiter = k
            .command(&["wait", "--for=condition=Ready=False", "node/node-1", "--timeout=30s"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        k.run(
            &["patch", "node", "node-1", "--subresource", "status", "--type", "strategic", "-p",
              r#"{"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady"}]}}"#],
            None,
        );
        let status = waiter.wait().unwrap();
        assert!(status.success(), "kubectl wait saw the condition");
        k.run(&["apply", "-f", "-"], Some(&NODE.replace("node-1", "node-2")));
        std::thread::sleep(Duration::from_millis(500));
        watch.kill().unwrap();
        let out = watch.wait_with_output().unwrap();
        let seen = String::from_utf8_lossy(&out.stdout);
        assert!(seen.contains("node/node-2"), "the watch saw node-2 arrive: {seen}");
        let _ = kubeconfig;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_events_and_leases_and_discovery() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        let resources = k.run(&["api-resources", "-o", "name"], None);
        for name in ["nodes", "services", "events", "namespaces", "leases.coordination.k8s.io", "events.events.k8s.io", "tokenreviews.authentication.k8s.io"] {
            assert!(resources.lines().any(|l| l == name), "{name} missing:\n{resources}");
        }
        k.run(&["create", "-f", "-"], Some(r#"
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: node-controller, namespace: kube-system}
spec: {holderIdentity: pod-a, leaseDurationSeconds: 15}
"#));
        let lease = k.json(&["get", "lease", "-n", "kube-system", "node-controller"]);
        assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
        k.run(&["create", "-f", "-"], Some(r#"
apiVersion: v1
kind: Event
metadata: {name: node-1.synced, namespace: default}
involvedObject: {kind: Node, name: node-1}
reason: Synced
message: Node synced successfully
type: Normal
"#));
        let events = k.run(&["get", "events", "-o", "jsonpath={.items[*].reason}"], None);
        assert_eq!(events, "Synced");
        let table = k.run(&["get", "events"], None);
        assert!(table.contains("REASON") && table.contains("node/node-1") && table.contains("Node synced successfully"), "{table}");
        let (code, _, err) = k.try_run(&["create", "-f", "-"], Some("apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: nowhere}\nspec: {ports: [{port: 1}]}\n"));
        assert_ne!(code, 0);
        assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");
    })
    .await;
}

/// Answers every HTTP request on a loopback port with `body`; returns the
/// port.
async fn http_answering(body: &'static str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_raw_reaches_a_pod_and_a_service_through_the_proxy() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let port = http_answering("# TYPE up gauge\nup 1\n").await;
    blocking(move || {
        k.run(
            &["create", "-f", "-"],
            Some(&format!(
                r#"
apiVersion: v1
kind: Pod
metadata: {{name: gateway-0, namespace: kube-system}}
spec: {{containers: [{{name: gateway, image: x, ports: [{{name: admin, containerPort: {port}}}]}}]}}
status: {{phase: Running, podIP: 127.0.0.1}}
---
apiVersion: v1
kind: Service
metadata: {{name: gateway, namespace: kube-system}}
spec: {{ports: [{{name: admin, port: {port}}}]}}
---
apiVersion: v1
kind: Endpoints
metadata: {{name: gateway, namespace: kube-system}}
subsets: [{{addresses: [{{ip: 127.0.0.1}}], ports: [{{name: admin, port: {port}}}]}}]
"#
            )),
        );
        for path in [
            "/api/v1/namespaces/kube-system/pods/gateway-0/proxy/metrics".to_owned(),
            format!("/api/v1/namespaces/kube-system/pods/gateway-0:{port}/proxy/metrics"),
            "/api/v1/namespaces/kube-system/services/gateway:admin/proxy/metrics".to_owned(),
        ] {
            let out = k.run(&["get", "--raw", &path], None);
            assert_eq!(out, "# TYPE up gauge\nup 1\n", "{path}");
        }
        let (code, _, err) = k.try_run(
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/kube-system/services/nothing:admin/proxy/",
            ],
            None,
        );
        assert_ne!(code, 0);
        assert!(err.contains("not found"), "{err}");
    })
    .await;
}

#[test]
fn the_server_binary_writes_a_kubeconfig_kubectl_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let port = ccm_sandbox::ports::free_port().unwrap();
    let mut server = Command::new(ccm_testkit::bin_dir().join("kube-test-apiserver"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--kubeconfig"])
        .arg(&kubeconfig)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !kubeconfig.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no kubeconfig written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", dir.path().join("cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    kubectl(&["apply", "-f", "-"], Some(NODE));
    assert_eq!(
        kubectl(&["get", "nodes", "-o", "name"], None).trim(),
        "node/node-1"
    );
    assert!(kubectl(&["version"], None).contains("v1.32.0-ccm-test"));
    server.kill().unwrap();
    server.wait().unwrap();
}

/// kubectl on PATH, and the oldest and newest versioned builds beside it
/// (`kubectl.1.27` ... `kubectl.1.33`), where the machine has them.
fn kubectls() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("kubectl")];
    let Some(dir) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("kubectl"))
            .find(|k| k.is_file())
            .and_then(|k| std::fs::canonicalize(k).ok())
            .and_then(|k| k.parent().map(PathBuf::from))
    }) else {
        return out;
    };
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let minor = name.strip_prefix("kubectl.1.")?.parse().ok()?;
            Some((minor, e.path()))
        })
        .collect();
    versioned.sort();
    if let (Some(first), Some(last)) = (versioned.first(), versioned.last()) {
        out.push(first.1.clone());
        if last.0 != first.0 {
            out.push(last.1.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verbs_users_try_work_with_the_oldest_and_newest_kubectl() {
    for binary in kubectls() {
        let server = ApiServer::start().await.unwrap();
        let k = Kubectl::with(&server, binary.clone());
        // A node as a kubelet registers it (not a kubectl verb: old
        // kubectls validate manifests with OpenAPI v2, not served here).
        let node: k8s_openapi::api::core::v1::Node = serde_norway::from_str(NODE).unwrap();
        let client = ccm_runtime::kube::client(Some(&k.kubeconfig))
            .await
            .unwrap();
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
            .create(&Default::default(), &node)
            .await
            .unwrap();
        blocking(move || {
            let name = k.binary.display().to_string();
            // kubectl's typed clients send these as protobuf.
            k.run(&["create", "namespace", "t1"], None);
            k.run(
                &["create", "service", "loadbalancer", "web", "--tcp=80:8080"],
                None,
            );
            k.run(
                &[
                    "create",
                    "service",
                    "clusterip",
                    "cip",
                    "--tcp=80:8080",
                    "-n",
                    "t1",
                ],
                None,
            );
            k.run(
                &["create", "service", "nodeport", "np", "--tcp=80:8080"],
                None,
            );
            let web = k.json(&["get", "service", "web"]);
            assert_eq!(web["spec"]["type"], "LoadBalancer", "{name}");
            assert!(
                web["spec"]["ports"][0]["nodePort"].as_i64().unwrap_or(0) >= 30000,
                "{name}: a node port was allocated: {web}"
            );
            let described = k.run(&["describe", "node", "node-1"], None);
            assert!(
                described.contains("Non-terminated Pods"),
                "{name}: {described}"
            );
            let described = k.run(&["describe", "service", "web"], None);
            assert!(described.contains("LoadBalancer"), "{name}: {described}");

            let mut watch = k
                .command(&["get", "services", "-w", "-o", "name"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(500));
            k.run(&["label", "service", "web", "tier=front"], None);
            k.run(&["annotate", "service", "web", "note=hello"], None);
            k.run(
                &[
                    "patch",
                    "service",
                    "web",
                    "-p",
                    r#"{"metadata":{"labels":{"a":"1"}}}"#,
                ],
                None,
            );
            k.run(
                &[
                    "patch",
                    "service",
                    "web",
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"labels":{"b":"2"}}}"#,
                ],
                None,
            );
            k.run(
                &[
                    "patch",
                    "service",
                    "web",
                    "--type",
                    "json",
                    "-p",
                    r#"[{"op":"add","path":"/metadata/labels/c","value":"3"}]"#,
                ],
                None,
            );
            k.run(
                &[
                    "wait",
                    "--for=jsonpath={.metadata.labels.c}=3",
                    "service/web",
                    "--timeout=20s",
                ],
                None,
            );
            let labels = k.json(&["get", "service", "web"])["metadata"]["labels"].clone();
            for (key, value) in [("tier", "front"), ("a", "1"), ("b", "2"), ("c", "3")] {
                assert_eq!(labels[key], value, "{name}: {labels}");
            }
            let annotations = k.json(&["get", "service", "web"])["metadata"]["annotations"].clone();
            assert_eq!(annotations["note"], "hello", "{name}");
            k.run(&["delete", "service", "np"], None);
            k.run(&["delete", "namespace", "t1"], None);
            std::thread::sleep(Duration::from_millis(300));
            watch.kill().unwrap();
            let out = watch.wait_with_output().unwrap();
            let seen = String::from_utf8_lossy(&out.stdout);
            assert!(
                seen.contains("service/web"),
                "{name}: the watch saw web change: {seen}"
            );
            let namespaces = k.run(&["get", "namespaces", "-o", "name"], None);
            assert!(!namespaces.contains("namespace/t1"), "{name}: {namespaces}");
        })
        .await;
    }
}

/// Kubelet serving CSRs as kubectl makes and approves them: created as a
/// node (`--as`, `--as-group`), the requester fields come from that
/// identity whatever the body says; `get csr` shows kube-apiserver's
/// columns; `certificate approve` and `deny` set the condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_csrs_as_a_node_and_approves_or_denies_them() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let request = data_encoding::BASE64
        .encode(include_str!("../../node-controller/src/testdata/rsa-serving-csr.pem").as_bytes());
    blocking(move || {
        let node = "system:node:ip-10-0-1-5.ec2.internal";
        for name in ["csr-a", "csr-b"] {
            let csr = format!(
                "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  signerName: kubernetes.io/kubelet-serving\n  usages: [digital signature, key encipherment, server auth]\n  username: system:admin\n  groups: [system:masters]\n  request: {request}\n"
            );
            k.run(&["create", "--as", node, "--as-group", "system:nodes", "-f", "-"], Some(&csr));
        }
        let a = k.json(&["get", "csr", "csr-a"]);
        assert_eq!(a["spec"]["username"], node, "from the caller, not the body");
        assert_eq!(a["spec"]["groups"], serde_json::json!(["system:nodes", "system:authenticated"]));
        let table = k.run(&["get", "csr"], None);
        assert!(table.contains("SIGNERNAME") && table.contains("REQUESTOR") && table.contains("Pending"), "{table}");
        k.run(&["certificate", "approve", "csr-a"], None);
        k.run(&["certificate", "deny", "csr-b"], None);
        let conditions = k.run(&["get", "csr", "-o", "jsonpath={.items[*].status.conditions[0].type}"], None);
        assert_eq!(conditions, "Approved Denied");
        let table = k.run(&["get", "csr"], None);
        assert!(table.contains("Approved") && table.contains("Denied"), "{table}");
    })
    .await;
}

/// The reasons of `kubectl get events` (a server-side Table) in the
/// order printed.
fn reasons(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

/// `--sort-by` sorts the Table's rows by a field of each row's object,
/// which kubectl asks the server to include (`includeObject=Object`).
/// Events written through core/v1 (client-go's recorder, the kubelet)
/// carry `lastTimestamp`; events written through events.k8s.io/v1
/// (kube-rs's Recorder) have it `null` in their core/v1 view, as
/// kube-apiserver converts them, and sort first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sorts_events_by_last_timestamp() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        let legacy = |name: &str, reason: &str, last: &str| {
            format!(
                "apiVersion: v1\nkind: Event\nmetadata: {{name: {name}, namespace: default}}\ninvolvedObject: {{kind: Node, name: node-1}}\nreason: {reason}\nmessage: {reason} happened\ntype: Normal\nsource: {{component: kubelet, host: node-1}}\nfirstTimestamp: \"2026-01-01T00:00:00Z\"\nlastTimestamp: \"{last}\"\ncount: 2\n---\n"
            )
        };
        // Created, and named, out of time order.
        let events = [
            legacy("a-third", "Third", "2026-01-01T00:03:00Z"),
            legacy("b-first", "First", "2026-01-01T00:01:00Z"),
            legacy("c-second", "Second", "2026-01-01T00:02:00Z"),
        ]
        .concat();
        k.run(&["create", "-f", "-"], Some(&events));
        k.run(
            &["create", "-f", "-"],
            Some(
                r#"
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: d-new, namespace: default}
eventTime: "2026-01-01T00:04:00.000000Z"
reportingController: ccm.example.com/node-controller
reportingInstance: pod-1
action: Sync
reason: New
note: written through events.k8s.io
type: Normal
regarding: {kind: Node, name: node-1}
"#,
            ),
        );
        let listed = k.run(&["get", "events"], None);
        assert_eq!(reasons(&listed), ["Third", "First", "Second", "New"], "{listed}");
        let sorted = k.run(&["get", "events", "--sort-by=.lastTimestamp"], None);
        assert_eq!(reasons(&sorted), ["New", "First", "Second", "Third"], "{sorted}");
        let wide = k.run(&["get", "events", "--sort-by=.lastTimestamp", "-o", "wide"], None);
        assert!(
            wide.contains("kubelet, node-1") && wide.contains("ccm.example.com/node-controller, pod-1"),
            "the source column: {wide}"
        );
        // The core/v1 view of the events.k8s.io event, as kube-apiserver
        // converts it: no deprecated fields, so no first or last timestamp
        // and no count.
        let new = k.json(&["get", "events", "d-new"]);
        assert_eq!(new["lastTimestamp"], Value::Null, "{new}");
        assert_eq!(new["firstTimestamp"], Value::Null, "{new}");
        assert!(new.get("count").is_none(), "{new}");
        assert_eq!(new["eventTime"], "2026-01-01T00:04:00.000000Z");
        assert_eq!(new["reportingComponent"], "ccm.example.com/node-controller");
        assert_eq!(new["source"], serde_json::json!({}));
        assert_eq!(new["message"], "written through events.k8s.io");
    })
    .await;
}

/// `kubectl explain` reads the OpenAPI v3 schemas of the served kinds,
/// following their `$ref`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_services_nodes_and_leases() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        let spec = k.run(&["explain", "service.spec"], None);
        for field in [
            "KIND:       Service",
            "FIELD: spec <ServiceSpec>",
            "ports\t<[]ServicePort>",
            "type\t<string>",
            "loadBalancerClass\t<string>",
            "externalTrafficPolicy\t<string>",
            "allocateLoadBalancerNodePorts\t<boolean>",
            "selector\t<map[string]string>",
        ] {
            assert!(spec.contains(field), "{field}:\n{spec}");
        }
        let port = k.run(&["explain", "service.spec.ports"], None);
        for field in [
            "port\t<integer> -required-",
            "nodePort\t<integer>",
            "targetPort\t<",
        ] {
            assert!(port.contains(field), "{field}:\n{port}");
        }
        let taints = k.run(&["explain", "node.spec.taints"], None);
        for field in [
            "FIELD: taints <[]Taint>",
            "effect\t<string> -required-",
            "key\t<string> -required-",
            "NoSchedule",
        ] {
            assert!(taints.contains(field), "{field}:\n{taints}");
        }
        let lease = k.run(&["explain", "lease.spec"], None);
        for field in [
            "GROUP:      coordination.k8s.io",
            "holderIdentity\t<string>",
            "leaseDurationSeconds\t<integer>",
            "renewTime\t<string>",
        ] {
            assert!(lease.contains(field), "{field}:\n{lease}");
        }
        let (code, _, err) = k.try_run(&["explain", "service.spec.nothing"], None);
        assert_ne!(code, 0);
        assert!(err.contains("field \"nothing\" does not exist"), "{err}");
    })
    .await;
}

/// `kubectl auth can-i` asks with a SelfSubjectAccessReview (protobuf),
/// `--list` with a SelfSubjectRulesReview; without RBAC everyone may do
/// anything. kubectl sends no credentials over plain http, so it cannot
/// be anyone once RBAC is on: the answers under RBAC, and that asking is
/// not a request in the RBAC report, are tested with a kube client in
/// kube-test-apiserver's `tests/reviews.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_asks_the_server() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        assert_eq!(
            k.run(&["auth", "can-i", "list", "nodes"], None).trim(),
            "yes"
        );
        assert_eq!(
            k.run(
                &["auth", "can-i", "delete", "nodes", "--as", "stranger"],
                None
            )
            .trim(),
            "yes"
        );
        assert_eq!(
            k.run(
                &[
                    "auth",
                    "can-i",
                    "get",
                    "services",
                    "-n",
                    "kube-system",
                    "--subresource",
                    "status"
                ],
                None
            )
            .trim(),
            "yes"
        );
        let list = k.run(&["auth", "can-i", "--list"], None);
        assert!(list.lines().any(|l| l.starts_with("*.*")), "{list}");
        // A SubjectAccessReview, as `kubectl create -f` sends one.
        let review: Value = serde_json::from_str(&k.run(
            &["create", "-f", "-", "-o", "json"],
            Some(
                "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: stranger\n  resourceAttributes: {verb: list, resource: nodes}\n",
            ),
        ))
        .unwrap();
        assert_eq!(review["kind"], "SubjectAccessReview", "{review}");
        assert_eq!(review["status"]["allowed"], true, "{review}");
        assert_eq!(review["spec"]["user"], "stranger", "{review}");
        // The server checks its fields: kubectl asks it to be strict.
        let (code, _, err) = k.try_run(
            &["create", "-f", "-"],
            Some(
                "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: stranger\n  verb: list\n",
            ),
        );
        assert_ne!(code, 0);
        assert!(err.contains("unknown field \"spec.verb\""), "{err}");
    })
    .await;
}

/// `kubectl get all` lists the kinds discovery puts in the `all`
/// category: of kube-apiserver's, pods and services are served here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_all_lists_pods_and_services() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        k.run(
            &["create", "-f", "-"],
            Some(&format!(
                "{SERVICE}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web-0, namespace: default, labels: {{app: web}}}}\nspec: {{containers: [{{name: web, image: web:1}}]}}\n"
            )),
        );
        let all = k.run(&["get", "all"], None);
        assert!(all.contains("pod/web-0") && all.contains("service/web"), "{all}");
        let names = k.run(&["get", "all", "-o", "name"], None);
        assert_eq!(names.lines().collect::<Vec<_>>(), ["pod/web-0", "service/web"], "{names}");
        let in_all = k.run(&["api-resources", "--categories=all", "-o", "name"], None);
        // kube-apiserver's `all`, less what this server does not serve
        // (cronjobs, horizontalpodautoscalers).
        assert_eq!(
            in_all.lines().collect::<Vec<_>>(),
            [
                "pods",
                "replicationcontrollers",
                "services",
                "daemonsets.apps",
                "deployments.apps",
                "replicasets.apps",
                "statefulsets.apps",
                "jobs.batch"
            ],
            "{in_all}"
        );
    })
    .await;
}

/// Leaving LoadBalancer for ClusterIP drops what only the old type used
/// and the request did not change (kube-apiserver's
/// `dropTypeDependentFields`): node ports, the health check node port,
/// the load balancer class, the external traffic policy; the node ports
/// are free again. A node port set in the same request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_to_cluster_ip_leaves_no_node_port() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    blocking(move || {
        let local = SERVICE.replace(
            "type: LoadBalancer",
            "type: LoadBalancer\n  externalTrafficPolicy: Local\n  loadBalancerClass: example.com/lb",
        );
        k.run(&["apply", "-f", "-"], Some(&local));
        let svc = k.json(&["get", "svc", "web"]);
        let node_port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert!(svc["spec"]["healthCheckNodePort"].is_i64(), "{svc}");

        k.run(&["patch", "svc", "web", "-p", r#"{"spec":{"type":"ClusterIP"}}"#], None);
        let svc = k.json(&["get", "svc", "web"]);
        let spec = &svc["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert!(spec["ports"][0].get("nodePort").is_none(), "{spec}");
        for gone in ["healthCheckNodePort", "loadBalancerClass", "externalTrafficPolicy"] {
            assert!(spec.get(gone).is_none(), "{gone}: {spec}");
        }
        assert_eq!(spec["ports"][0]["port"], 80);
        assert!(spec["clusterIP"].is_string(), "the cluster IP stays: {spec}");
        let table = k.run(&["get", "svc", "web"], None);
        assert!(table.contains("80/TCP") && !table.contains("80:"), "{table}");

        // Back to NodePort: node ports again, the freed one first.
        k.run(&["patch", "svc", "web", "-p", r#"{"spec":{"type":"NodePort"}}"#], None);
        let svc = k.json(&["get", "svc", "web"]);
        assert_eq!(svc["spec"]["ports"][0]["nodePort"], node_port, "{svc}");
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster", "{svc}");

        // A node port the request sets is the user's: not dropped, refused.
        let (code, _, err) = k.try_run(
            &["patch", "svc", "web", "-p",
              r#"{"spec":{"type":"ClusterIP","ports":[{"port":80,"nodePort":31999}]}}"#],
            None,
        );
        assert_ne!(code, 0);
        assert!(
            err.contains("spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"),
            "{err}"
        );
    })
    .await;
}

/// Who may read Nodes: the ServiceAccount `default/robot` and the group
/// `ops` (client certificates name theirs in O).
const NODE_READERS: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-reader}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: node-readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-reader}
subjects:
- {kind: ServiceAccount, name: robot, namespace: default}
- {kind: Group, name: ops, apiGroup: rbac.authorization.k8s.io}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_get_tokens_that_work_until_they_expire_or_the_account_goes() {
    let server = ApiServer::start().await.unwrap();
    server.enforce_rbac(&kube_test_apiserver::documents(NODE_READERS).unwrap());
    let kubectl = Kubectl::new(&server);
    blocking(move || {
        kubectl.run(&["create", "serviceaccount", "robot"], None);
        let account = kubectl.json(&["get", "sa", "robot"]);
        let uid = account["metadata"]["uid"].as_str().unwrap().to_owned();
        let token = kubectl.run(&["create", "token", "robot", "--duration", "10m"], None);
        let token = token.trim();
        // Its own grants, no more; over HTTPS, as kubectl sends no token
        // in clear.
        kubectl.run(&["--token", token, "get", "nodes"], None);
        let (code, _, err) = kubectl.try_run(&["--token", token, "get", "services"], None);
        assert_ne!(code, 0);
        assert!(
            err.contains("system:serviceaccount:default:robot")
                && err.contains("cannot list resource \"services\""),
            "{err}"
        );
        // The API server reviews it as kube-apiserver does.
        let review = format!(
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {{token: {token}}}\n"
        );
        let reviewed: Value =
            serde_json::from_str(&kubectl.run(&["create", "-f", "-", "-o", "json"], Some(&review)))
                .unwrap();
        assert_eq!(reviewed["status"]["authenticated"], true, "{reviewed}");
        assert_eq!(
            reviewed["status"]["user"]["username"],
            "system:serviceaccount:default:robot"
        );
        assert_eq!(reviewed["status"]["user"]["uid"], uid.as_str());
        // A token for another audience is no key to the API server.
        let elsewhere = kubectl.run(
            &["create", "token", "robot", "--audience", "cloud-gateway"],
            None,
        );
        let (code, _, err) = kubectl.try_run(&["--token", elsewhere.trim(), "get", "nodes"], None);
        assert_ne!(code, 0);
        assert!(err.contains("Unauthorized"), "{err}");
        // Too short a lifetime, and an account that does not exist.
        let (code, _, err) =
            kubectl.try_run(&["create", "token", "robot", "--duration", "5m"], None);
        assert_ne!(code, 0);
        assert!(err.contains("less than 10 minutes"), "{err}");
        let (code, _, err) = kubectl.try_run(&["create", "token", "nobody"], None);
        assert_ne!(code, 0);
        assert!(
            err.contains("serviceaccounts \"nobody\" not found"),
            "{err}"
        );
        // Deleting the account revokes its tokens.
        kubectl.run(&["delete", "sa", "robot"], None);
        let (code, _, err) = kubectl.try_run(&["--token", token, "get", "nodes"], None);
        assert_ne!(code, 0);
        assert!(err.contains("Unauthorized"), "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_the_api_only_over_https_with_a_certificate_of_its_ca() {
    let server = ApiServer::start().await.unwrap();
    server.enforce_rbac(&kube_test_apiserver::documents(NODE_READERS).unwrap());
    let kubectl = Kubectl::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    // A user of the cluster CA (CN jane, O ops), one of another CA that
    // claims system:masters, and that other CA.
    let jane = server.pki().issue_client("jane", Some("ops")).unwrap();
    let other = kube_test_apiserver::ClusterPki::generate().unwrap();
    let mallory = other
        .issue_client("mallory", Some("system:masters"))
        .unwrap();
    let (jane_cert, jane_key) = (
        write("jane.crt", &jane.cert_pem),
        write("jane.key", &jane.key_pem),
    );
    let (mallory_cert, mallory_key) = (
        write("mallory.crt", &mallory.cert_pem),
        write("mallory.key", &mallory.key_pem),
    );
    let other_ca = write("other-ca.crt", &other.ca_pem);
    let (https, http) = (server.url(), format!("http://{}", server.addr()));
    blocking(move || {
        // Only as the certificate's user may: Nodes, not Services.
        let as_cert = |cert: &str, key: &str, args: &[&str]| {
            let mut all = vec![
                "--token",
                "",
                "--client-certificate",
                cert,
                "--client-key",
                key,
            ];
            all.extend(args);
            kubectl.try_run(&all, None)
        };
        let (code, _, err) = as_cert(&jane_cert, &jane_key, &["get", "nodes"]);
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = as_cert(&jane_cert, &jane_key, &["get", "services"]);
        assert_ne!(code, 0);
        assert!(err.contains("User \"jane\" cannot list"), "{err}");
        // Another CA's certificate does not get through the handshake.
        let (code, _, err) = as_cert(&mallory_cert, &mallory_key, &["get", "nodes"]);
        assert_ne!(code, 0);
        assert!(!err.contains("forbidden"), "{err}");
        // Nor does a client that trusts another CA, nor one in clear.
        let (code, _, err) = kubectl.try_run(
            &[
                "--server",
                &https,
                "--certificate-authority",
                &other_ca,
                "get",
                "nodes",
            ],
            None,
        );
        assert_ne!(code, 0);
        assert!(err.contains("certificate"), "{err}");
        let (code, out, _) = kubectl.try_run(&["--server", &http, "get", "nodes"], None);
        assert_ne!(code, 0);
        assert!(out.is_empty());
    })
    .await;
}
