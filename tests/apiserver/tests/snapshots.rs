//! The CSI snapshot API (`snapshot.storage.k8s.io/v1`) that
//! external-snapshotter's snapshot-controller and csi-snapshotter sidecar
//! use, served as its CRDs serve it in a real cluster: VolumeSnapshots
//! (namespaced), VolumeSnapshotContents and VolumeSnapshotClasses, kept as
//! written, the first two with a status subresource; through the real
//! kubectl, and under RBAC through a kube client.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube_test_apiserver::{ApiServer, TokenUser};
use serde_json::{Value, json};

/// How long anything awaited here may take.
const LIMIT: Duration = Duration::from_secs(60);

const NAMESPACE: &str = "apps";

/// A namespace, then one object of each kind, as a user applies them.
const MANIFEST: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: ebs}
driver: ebs.csi.aws.com
deletionPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: db, namespace: apps}
spec:
  source: {persistentVolumeClaimName: data}
  volumeSnapshotClassName: ebs
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: snapcontent-db}
spec:
  driver: ebs.csi.aws.com
  deletionPolicy: Delete
  source: {volumeHandle: vol-0123456789abcdef0}
  volumeSnapshotClassName: ebs
  volumeSnapshotRef: {name: db, namespace: apps}
"#;

/// Runs a test's body within [`LIMIT`].
async fn within<T>(body: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, body)
        .await
        .expect("the test finishes in time")
}

fn kubectl_installed() -> bool {
    std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// kubectl with a kubeconfig for the server and a discovery cache of its
/// own.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn new(server: &ApiServer, dir: &Path) -> Self {
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Self {
            kubeconfig,
            cache: dir.join("cache"),
        }
    }

    /// Runs kubectl: whether it succeeded, its stdout and its stderr.
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let output = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "20s"])
            .args(args)
            .env("KUBECACHEDIR", &self.cache)
            .output()
            .await
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Runs kubectl, which must succeed; its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }
}

/// The rows of a table kubectl printed, each cell by its column's header:
/// a cell starts where its header does, and may be empty.
fn rows(printed: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = printed.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut at = 0;
    for word in header.split_whitespace() {
        let start = at + header[at..].find(word).expect("a word of the header");
        starts.push((start, word));
        at = start + word.len();
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(i, (start, name))| {
                    let end = starts.get(i + 1).map_or(line.len(), |(s, _)| *s);
                    let cell = line.get(*start..end.min(line.len())).unwrap_or_default();
                    (name.to_string(), cell.trim().to_owned())
                })
                .collect()
        })
        .collect()
}

/// The cells of `row` under `headers`.
fn cells<'a>(row: &'a BTreeMap<String, String>, headers: &[&str]) -> Vec<&'a str> {
    headers
        .iter()
        .map(|h| row.get(*h).map_or("(no such column)", String::as_str))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_snapshots_are_served_as_kubectl_expects() {
    if !kubectl_installed() {
        eprintln!("kubectl is not installed; nothing to check");
        return;
    }
    within(async {
        let server = ApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubectl = Kubectl::new(&server, dir.path());
        let manifest = dir.path().join("snapshots.yaml");
        std::fs::write(&manifest, MANIFEST).unwrap();

        // Discovery: the three kinds, with the CRDs' names and scopes.
        let listed = kubectl
            .ok(&["api-resources", "--api-group=snapshot.storage.k8s.io"])
            .await;
        let lines: Vec<Vec<&str>> = listed
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let api_version = "snapshot.storage.k8s.io/v1";
        assert_eq!(
            lines,
            [
                vec!["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"],
                vec![
                    "volumesnapshotclasses",
                    "vsclass,vsclasses",
                    api_version,
                    "false",
                    "VolumeSnapshotClass"
                ],
                vec![
                    "volumesnapshotcontents",
                    "vsc,vscs",
                    api_version,
                    "false",
                    "VolumeSnapshotContent"
                ],
                vec!["volumesnapshots", "vs", api_version, "true", "VolumeSnapshot"],
            ],
            "{listed}"
        );

        let applied = kubectl.ok(&["apply", "-f", manifest.to_str().unwrap()]).await;
        assert_eq!(
            applied.lines().collect::<Vec<_>>(),
            [
                "namespace/apps created",
                "volumesnapshotclass.snapshot.storage.k8s.io/ebs created",
                "volumesnapshot.snapshot.storage.k8s.io/db created",
                "volumesnapshotcontent.snapshot.storage.k8s.io/snapcontent-db created",
            ],
            "{applied}"
        );

        // Listed with the CRDs' printer columns; not ready yet.
        let listed = kubectl.ok(&["get", "volumesnapshots", "-A"]).await;
        let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAMESPACE",
                "NAME",
                "READYTOUSE",
                "SOURCEPVC",
                "SOURCESNAPSHOTCONTENT",
                "RESTORESIZE",
                "SNAPSHOTCLASS",
                "SNAPSHOTCONTENT",
                "CREATIONTIME",
                "AGE"
            ],
            "{listed}"
        );
        let table = rows(&listed);
        assert_eq!(table.len(), 1, "{listed}");
        let columns = [
            "NAMESPACE",
            "NAME",
            "READYTOUSE",
            "SOURCEPVC",
            "SNAPSHOTCLASS",
            "SNAPSHOTCONTENT",
        ];
        assert_eq!(
            cells(&table[0], &columns),
            [NAMESPACE, "db", "", "data", "ebs", ""],
            "{listed}"
        );
        let contents = kubectl.ok(&["get", "vsc"]).await;
        let table = rows(&contents);
        assert_eq!(
            cells(
                &table[0],
                &[
                    "NAME",
                    "DELETIONPOLICY",
                    "DRIVER",
                    "VOLUMESNAPSHOTCLASS",
                    "VOLUMESNAPSHOT",
                    "VOLUMESNAPSHOTNAMESPACE"
                ]
            ),
            [
                "snapcontent-db",
                "Delete",
                "ebs.csi.aws.com",
                "ebs",
                "db",
                NAMESPACE
            ],
            "{contents}"
        );
        let classes = kubectl.ok(&["get", "vsclass"]).await;
        let table = rows(&classes);
        assert_eq!(
            cells(&table[0], &["NAME", "DRIVER", "DELETIONPOLICY"]),
            ["ebs", "ebs.csi.aws.com", "Delete"],
            "{classes}"
        );

        // Read back as written.
        let got = kubectl
            .ok(&["get", "vs", "-n", NAMESPACE, "db", "-o", "json"])
            .await;
        let got: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(got["apiVersion"], api_version);
        assert_eq!(got["kind"], "VolumeSnapshot");
        assert_eq!(
            got["spec"],
            json!({"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "ebs"})
        );
        assert!(got.get("status").is_none(), "{got}");
        let got = kubectl
            .ok(&["get", "vsc", "snapcontent-db", "-o", "json"])
            .await;
        let got: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(got["spec"]["source"]["volumeHandle"], "vol-0123456789abcdef0");
        assert_eq!(
            got["spec"]["volumeSnapshotRef"],
            json!({"name": "db", "namespace": NAMESPACE})
        );
        assert!(got["metadata"].get("namespace").is_none(), "{got}");

        // The status goes through the status subresource only.
        let status = r#"{"status":{"readyToUse":true,"boundVolumeSnapshotContentName":"snapcontent-db"}}"#;
        let patched = kubectl
            .ok(&[
                "patch",
                "vs",
                "db",
                "-n",
                NAMESPACE,
                "--subresource=status",
                "--type=merge",
                "-p",
                status,
            ])
            .await;
        assert_eq!(
            patched.trim(),
            "volumesnapshot.snapshot.storage.k8s.io/db patched"
        );
        let ready = kubectl
            .ok(&[
                "get",
                "vs",
                "-n",
                NAMESPACE,
                "db",
                "-o",
                "jsonpath={.status.readyToUse}",
            ])
            .await;
        assert_eq!(ready, "true");
        let ignored = kubectl
            .ok(&[
                "patch",
                "vs",
                "db",
                "-n",
                NAMESPACE,
                "--type=merge",
                "-p",
                r#"{"status":{"readyToUse":false}}"#,
            ])
            .await;
        assert_eq!(
            ignored.trim(),
            "volumesnapshot.snapshot.storage.k8s.io/db patched (no change)"
        );
        let listed = kubectl.ok(&["get", "vs", "-n", NAMESPACE]).await;
        assert_eq!(
            cells(&rows(&listed)[0], &["NAME", "READYTOUSE", "SNAPSHOTCONTENT"]),
            ["db", "true", "snapcontent-db"],
            "{listed}"
        );

        // A strategic merge patch is refused, as kube-apiserver refuses
        // one of a custom resource.
        let (ok, _, err) = kubectl
            .run(&[
                "patch",
                "vs",
                "db",
                "-n",
                NAMESPACE,
                "-p",
                r#"{"metadata":{"labels":{"app":"db"}}}"#,
            ])
            .await;
        assert!(!ok);
        assert!(
            err.contains("application/strategic-merge-patch+json is not supported"),
            "{err}"
        );

        // OpenAPI: kubectl explain finds the kind.
        let explained = kubectl.ok(&["explain", "volumesnapshots"]).await;
        let head: Vec<Vec<&str>> = explained
            .lines()
            .take(3)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            head,
            [
                vec!["GROUP:", "snapshot.storage.k8s.io"],
                vec!["KIND:", "VolumeSnapshot"],
                vec!["VERSION:", "v1"]
            ],
            "{explained}"
        );
        assert!(explained.contains("point-in-time snapshot"), "{explained}");

        let deleted = kubectl.ok(&["delete", "vs", "-n", NAMESPACE, "db"]).await;
        assert_eq!(
            deleted.trim(),
            r#"volumesnapshot.snapshot.storage.k8s.io "db" deleted"#
        );
        let deleted = kubectl
            .ok(&["delete", "vsc/snapcontent-db", "vsclass/ebs"])
            .await;
        assert_eq!(
            deleted.lines().collect::<Vec<_>>(),
            [
                r#"volumesnapshotcontent.snapshot.storage.k8s.io "snapcontent-db" deleted"#,
                r#"volumesnapshotclass.snapshot.storage.k8s.io "ebs" deleted"#,
            ],
            "{deleted}"
        );
        let (ok, out, err) = kubectl
            .run(&[
                "get",
                "volumesnapshots,volumesnapshotcontents,volumesnapshotclasses",
                "-A",
            ])
            .await;
        assert!(ok, "{err}");
        assert_eq!(out, "");
        assert_eq!(err.trim(), "No resources found");
    })
    .await;
}

/// The csi-snapshotter sidecar's grants (external-snapshotter's
/// `rbac-csi-snapshotter.yaml`, the rules on snapshots).
const SNAPSHOTTER_POLICY: &str = r#"
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: external-snapshotter-runner}
rules:
  - {apiGroups: [snapshot.storage.k8s.io], resources: [volumesnapshotclasses], verbs: [get, list, watch]}
  - {apiGroups: [snapshot.storage.k8s.io], resources: [volumesnapshotcontents], verbs: [get, list, watch, update, patch]}
  - {apiGroups: [snapshot.storage.k8s.io], resources: [volumesnapshotcontents/status], verbs: [update, patch]}
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: csi-snapshotter-role}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: external-snapshotter-runner}
subjects: [{kind: ServiceAccount, name: csi-snapshotter, namespace: kube-system}]
"#;

fn snapshot_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

#[tokio::test]
async fn rbac_grants_the_snapshotter_its_snapshot_contents_and_their_status_only() {
    within(async {
        let server = ApiServer::start().await.unwrap();
        let admin = server.client().await.unwrap();
        let contents = snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents");
        let snapshots = snapshot_api("VolumeSnapshot", "volumesnapshots");
        let content: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "snapcontent-db"},
            "spec": {"driver": "ebs.csi.aws.com", "deletionPolicy": "Delete",
                "source": {"volumeHandle": "vol-1"}, "volumeSnapshotRef": {"name": "db", "namespace": "default"}},
        }))
        .unwrap();
        Api::<DynamicObject>::all_with(admin.clone(), &contents)
            .create(&Default::default(), &content)
            .await
            .unwrap();
        let snapshot: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "db"}, "spec": {"source": {"persistentVolumeClaimName": "data"}},
        }))
        .unwrap();
        Api::<DynamicObject>::namespaced_with(admin, "default", &snapshots)
            .create(&Default::default(), &snapshot)
            .await
            .unwrap();

        server.enforce_rbac(&kube_test_apiserver::documents(SNAPSHOTTER_POLICY).unwrap());
        server.register_token(
            "snapshotter-token",
            TokenUser::service_account("kube-system", "csi-snapshotter", &[]),
        );
        let mut config = server.client_config(Some("snapshotter-token"));
        config.default_retry = false;
        let snapshotter = kube::Client::try_from(config).unwrap();
        let contents = Api::<DynamicObject>::all_with(snapshotter.clone(), &contents);
        let listed = contents.list(&Default::default()).await.unwrap();
        assert_eq!(listed.items.len(), 1);
        let ready = Patch::Merge(json!({"status": {"readyToUse": true, "snapshotHandle": "snap-1"}}));
        let patched = contents
            .patch_status("snapcontent-db", &PatchParams::default(), &ready)
            .await
            .unwrap();
        assert_eq!(patched.data["status"]["readyToUse"], true);
        assert_eq!(patched.data["spec"]["driver"], "ebs.csi.aws.com");

        let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
        let err = contents
            .delete("snapcontent-db", &Default::default())
            .await
            .unwrap_err();
        assert!(forbidden(err));
        let snapshots = Api::<DynamicObject>::namespaced_with(snapshotter, "default", &snapshots);
        let err = snapshots
            .patch_status("db", &PatchParams::default(), &ready)
            .await
            .unwrap_err();
        assert!(forbidden(err));
        let report = server.rbac_report().unwrap();
        let denied: Vec<&str> = report["denied"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["resource"].as_str().unwrap_or_default())
            .collect();
        assert!(denied.contains(&"volumesnapshots/status"), "{report}");
    })
    .await;
}
