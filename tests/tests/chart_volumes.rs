//! The chart with volumes (`volumes.enabled`), as an operator reads what it
//! renders: the volume controller's Deployment with upstream's four CSI
//! sidecars on one socket, the CSIDriver and the StorageClass, the
//! gateway's role for the volume controller, and the sidecars' RBAC as the
//! API server would decide it (the test API server's own evaluator). With
//! volumes off, the default, none of it. `helm/check.py check` validates
//! the same renders against the Kubernetes schemas; `chart_pods.rs` runs
//! them.

use kube_test_apiserver::rbac::{Attributes, Rbac, User};
use serde_json::Value;

const DRIVER: &str = "sim.csi.cloudgateway.io";
const SIDECARS: [&str; 4] = [
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
    "csi-snapshotter",
];

fn render(sets: &[&str]) -> Vec<Value> {
    let mut all = vec!["gateway.provider=sim".to_owned()];
    all.extend(sets.iter().map(|s| s.to_string()));
    ccm_testkit::chart::render_objects(&[], &all).unwrap()
}

fn with_volumes() -> Vec<Value> {
    render(&["volumes.enabled=true"])
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The volume controller's pod spec.
fn pod(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", "ccm-volume-controller").expect("the Deployment")["spec"]["template"]
        ["spec"]
}

/// The volume controller's ServiceAccount, as the API server knows it.
fn volume_controller() -> User {
    User {
        username: "system:serviceaccount:kube-system:ccm-volume-controller".into(),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
            "system:authenticated".into(),
        ],
    }
}

/// Whether the chart's RBAC lets the volume controller's pod do `verb` on
/// `resource` (`[group/]resource[/subresource]`, e.g.
/// `storage.k8s.io/volumeattachments/status`) cluster-wide.
fn may(rbac: &Rbac, verb: &str, resource: &str) -> bool {
    may_on(rbac, verb, resource, None)
}

/// [`may`] on one object: `(namespace, name)`.
fn may_on(rbac: &Rbac, verb: &str, resource: &str, object: Option<(&str, &str)>) -> bool {
    let (group, resource) = match resource.split_once('/') {
        Some((group, rest)) if group.contains('.') => (group, rest),
        _ => ("", resource),
    };
    let (namespace, name) = object.unzip();
    let attributes = Attributes::resource(verb, group, resource, namespace, name);
    rbac.check(&volume_controller(), &attributes).0
}

#[test]
fn the_volume_controller_runs_with_four_sidecars_on_one_socket() {
    let docs = with_volumes();
    let deployment = find(&docs, "Deployment", "ccm-volume-controller").unwrap();
    assert_eq!(deployment["metadata"]["namespace"], "kube-system");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = pod(&docs);
    assert_eq!(pod["serviceAccountName"], "ccm-volume-controller");
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "volume-controller",
            "csi-provisioner",
            "csi-attacher",
            "csi-resizer",
            "csi-snapshotter"
        ]
    );
    // One emptyDir at /csi in every container.
    let socket: Vec<&Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "socket-dir")
        .collect();
    assert_eq!(socket.len(), 1);
    assert_eq!(socket[0]["emptyDir"], serde_json::json!({}));
    for c in pod["containers"].as_array().unwrap() {
        let mounts = c["volumeMounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m["name"] == "socket-dir" && m["mountPath"] == "/csi"),
            "{}: {mounts:?}",
            c["name"]
        );
        let security = &c["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{}", c["name"]);
        assert_eq!(security["allowPrivilegeEscalation"], false, "{}", c["name"]);
        assert_eq!(
            strings(&security["capabilities"]["drop"]),
            ["ALL"],
            "{}",
            c["name"]
        );
        assert!(
            !c["resources"]["limits"]["memory"].is_null(),
            "{}",
            c["name"]
        );
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);

    // The volume controller: the shared flags, the socket, no lease.
    let controller = container(pod, "volume-controller");
    assert_eq!(
        strings(&controller["command"]),
        ["/usr/local/bin/volume-controller"]
    );
    let args = strings(&controller["args"]);
    for flag in [
        "--csi-address=unix:///csi/csi.sock",
        "--admin-listen=0.0.0.0:7441",
        "--gateway-address=https://$(CCM_GATEWAY_SERVICE_HOST):7400",
        "--gateway-token-file=/var/run/secrets/cloud-gateway/token",
        "--gateway-ca-file=/etc/cloud-gateway/ca/ca.crt",
        "--gateway-server-name=ccm-gateway.kube-system.svc",
        "--cluster-name=kubernetes",
    ] {
        assert!(args.contains(&flag), "{flag} missing: {args:?}");
    }
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--leader-elect") || a.starts_with("--diagnostics")),
        "{args:?}"
    );

    // The sidecars: upstream's images at pinned releases, on the socket,
    // electing their leaders in the release's namespace.
    let images = [
        (
            "csi-provisioner",
            "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0",
        ),
        (
            "csi-attacher",
            "registry.k8s.io/sig-storage/csi-attacher:v4.12.0",
        ),
        (
            "csi-resizer",
            "registry.k8s.io/sig-storage/csi-resizer:v2.2.1",
        ),
        (
            "csi-snapshotter",
            "registry.k8s.io/sig-storage/csi-snapshotter:v8.6.0",
        ),
    ];
    for (name, image) in images {
        let sidecar = container(pod, name);
        assert_eq!(sidecar["image"], image);
        let args = strings(&sidecar["args"]);
        for flag in [
            "--csi-address=/csi/csi.sock",
            "--leader-election",
            "--leader-election-namespace=kube-system",
        ] {
            assert!(args.contains(&flag), "{name}: {flag} missing: {args:?}");
        }
    }
    let provisioner = strings(&container(pod, "csi-provisioner")["args"]);
    assert!(
        provisioner.contains(&"--extra-create-metadata"),
        "{provisioner:?}"
    );
    assert!(
        provisioner.contains(&"--default-fstype=ext4"),
        "{provisioner:?}"
    );
    // Topology is GA in external-provisioner v6: no feature gate to set.
    assert!(
        !provisioner.iter().any(|a| a.starts_with("--feature-gates")),
        "{provisioner:?}"
    );
}

#[test]
fn the_sidecars_images_and_the_volume_controllers_settings_come_from_values() {
    let docs = render(&[
        "volumes.enabled=true",
        "volumes.replicas=3",
        "volumes.adminPort=7451",
        "volumes.sidecars.attacher.image.tag=v4.12.1",
        "volumes.sidecars.resizer.extraArgs=[--timeout=60s]",
        "volumes.sidecars.snapshotter.enabled=false",
    ]);
    assert_eq!(
        find(&docs, "Deployment", "ccm-volume-controller").unwrap()["spec"]["replicas"],
        3
    );
    let pod = pod(&docs);
    assert!(
        strings(&container(pod, "volume-controller")["args"])
            .contains(&"--admin-listen=0.0.0.0:7451")
    );
    assert_eq!(
        container(pod, "csi-attacher")["image"],
        "registry.k8s.io/sig-storage/csi-attacher:v4.12.1"
    );
    assert!(strings(&container(pod, "csi-resizer")["args"]).contains(&"--timeout=60s"));
    // Without the snapshot CRDs: no snapshotter, and none of its grants.
    assert!(
        pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "csi-snapshotter")
    );
    assert!(find(&docs, "ClusterRole", "ccm-csi-snapshotter").is_none());
    let rbac = Rbac::from_objects(&docs);
    let contents = "snapshot.storage.k8s.io/volumesnapshotcontents";
    assert!(!may(&rbac, "update", contents));
}

#[test]
fn the_csidriver_and_the_storageclass_name_the_providers_driver() {
    let docs = with_volumes();
    let driver = find(&docs, "CSIDriver", DRIVER).expect("the CSIDriver");
    assert_eq!(driver["apiVersion"], "storage.k8s.io/v1");
    assert_eq!(driver["spec"]["attachRequired"], true);
    assert_eq!(driver["spec"]["podInfoOnMount"], false);
    assert_eq!(driver["spec"]["fsGroupPolicy"], "File");
    let class = find(&docs, "StorageClass", "cloud-volumes").expect("the StorageClass");
    assert_eq!(class["provisioner"], DRIVER);
    assert_eq!(class["volumeBindingMode"], "WaitForFirstConsumer");
    assert_eq!(class["allowVolumeExpansion"], true);
    assert_eq!(class["reclaimPolicy"], "Delete");
    assert!(class["parameters"].is_null(), "{class}");

    // Named, with the provider's parameters; or left out.
    let named = render(&[
        "volumes.enabled=true",
        "volumes.storageClass.name=fast",
        "volumes.storageClass.parameters.type=fast",
    ]);
    let class = find(&named, "StorageClass", "fast").unwrap();
    assert_eq!(class["parameters"], serde_json::json!({"type": "fast"}));
    let none = render(&["volumes.enabled=true", "volumes.storageClass.create=false"]);
    assert!(!none.iter().any(|d| d["kind"] == "StorageClass"));
    assert!(find(&none, "CSIDriver", DRIVER).is_some());

    // On AWS, EBS's driver name.
    let aws = ccm_testkit::chart::render_objects(
        &[],
        &[
            "gateway.provider=aws".into(),
            "gateway.aws.region=eu-west-1".into(),
            "volumes.enabled=true".into(),
        ],
    )
    .unwrap();
    assert!(find(&aws, "CSIDriver", "ebs.csi.aws.com").is_some());
    assert_eq!(
        find(&aws, "StorageClass", "cloud-volumes").unwrap()["provisioner"],
        "ebs.csi.aws.com"
    );

    // With the gateway elsewhere there is no provider to ask.
    let err = ccm_testkit::chart::run(&[
        "render",
        "--set",
        "gateway.enabled=false",
        "--set",
        "gateway.address=https://10.0.0.10:7400",
        "--set",
        "gateway.tls.existingSecret=external-gateway-ca",
        "--set",
        "volumes.enabled=true",
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("volumes.csiDriver is required"), "{err}");
}

#[test]
fn the_gateway_gives_the_volume_controllers_serviceaccount_the_role_volume() {
    let roles = |docs: &[Value]| -> Vec<String> {
        let gateway = find(docs, "Deployment", "ccm-gateway").unwrap();
        strings(&gateway["spec"]["template"]["spec"]["containers"][0]["args"])
            .iter()
            .find_map(|a| a.strip_prefix("--service-account-roles="))
            .unwrap()
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    let on = roles(&with_volumes());
    assert_eq!(
        on,
        [
            "kube-system/ccm-node-controller=node",
            "kube-system/ccm-service-controller=service",
            "kube-system/ccm-route-controller=route",
            "kube-system/ccm-volume-controller=volume"
        ]
    );
    let off = roles(&render(&[]));
    assert!(!off.iter().any(|r| r.contains("volume")), "{off:?}");
}

/// Each sidecar's rules, from its release's deploy/kubernetes/rbac.yaml
/// (external-snapshotter: deploy/kubernetes/csi-snapshotter/
/// rbac-csi-snapshotter.yaml), less what those files leave commented out.
const UPSTREAM: &[(&str, &[&str])] = &[
    // external-provisioner v6.3.0
    (
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        "persistentvolumeclaims",
        &["get", "list", "watch", "update"],
    ),
    ("storage.k8s.io/storageclasses", &["get", "list", "watch"]),
    ("events", &["list", "watch", "create", "update", "patch"]),
    (
        "snapshot.storage.k8s.io/volumesnapshots",
        &["get", "list", "watch", "update"],
    ),
    (
        "snapshot.storage.k8s.io/volumesnapshotcontents",
        &["get", "list"],
    ),
    ("storage.k8s.io/csinodes", &["get", "list", "watch"]),
    ("nodes", &["get", "list", "watch"]),
    (
        "storage.k8s.io/volumeattachments",
        &["get", "list", "watch"],
    ),
    // external-attacher v4.12.0
    ("persistentvolumes", &["get", "list", "watch", "patch"]),
    ("storage.k8s.io/csinodes", &["get", "list", "watch"]),
    (
        "storage.k8s.io/volumeattachments",
        &["get", "list", "watch", "patch"],
    ),
    ("storage.k8s.io/volumeattachments/status", &["patch"]),
    // external-resizer v2.2.1
    ("persistentvolumes", &["get", "list", "watch", "patch"]),
    ("persistentvolumeclaims", &["get", "list", "watch"]),
    ("pods", &["get", "list", "watch"]),
    ("persistentvolumeclaims/status", &["patch"]),
    (
        "storage.k8s.io/volumeattributesclasses",
        &["get", "list", "watch"],
    ),
    // external-snapshotter v8.6.0, its csi-snapshotter
    (
        "snapshot.storage.k8s.io/volumesnapshotclasses",
        &["get", "list", "watch"],
    ),
    (
        "snapshot.storage.k8s.io/volumesnapshotcontents",
        &["get", "list", "watch", "update"],
    ),
    ("snapshot.storage.k8s.io/volumesnapshotcontents", &["patch"]),
    (
        "snapshot.storage.k8s.io/volumesnapshotcontents/status",
        &["update", "patch"],
    ),
];

#[test]
fn the_sidecars_get_upstreams_rules_and_their_own_leases_only() {
    let docs = with_volumes();
    let rbac = Rbac::from_objects(&docs);
    for (resource, verbs) in UPSTREAM {
        for verb in *verbs {
            // Cluster-wide, and so in any namespace.
            assert!(
                may(&rbac, verb, resource),
                "{verb} {resource} is not granted"
            );
            assert!(may_on(&rbac, verb, resource, Some(("apps", "x"))));
        }
    }
    // Each sidecar's rules in a ClusterRole of its own, bound to the pod's
    // ServiceAccount.
    let account = serde_json::json!([{
        "kind": "ServiceAccount", "name": "ccm-volume-controller", "namespace": "kube-system",
    }]);
    for sidecar in SIDECARS {
        let name = format!("ccm-{sidecar}");
        assert!(find(&docs, "ClusterRole", &name).is_some(), "{name}");
        let binding = find(&docs, "ClusterRoleBinding", &name).unwrap();
        assert_eq!(binding["roleRef"]["name"], name.as_str());
        assert_eq!(binding["subjects"], account);
    }
    // The volume controller itself reads nothing: what it may do beyond
    // the sidecars' rules is system:auth-delegator's (its admin port).
    assert!(find(&docs, "ClusterRole", "ccm-volume-controller").is_none());
    assert!(may(&rbac, "create", "authentication.k8s.io/tokenreviews"));

    // Leader election: each sidecar's own Lease, which it names after the
    // driver, in the release's namespace.
    let leases = "coordination.k8s.io/leases";
    for lease in [
        "sim-csi-cloudgateway-io",
        "external-attacher-leader-sim-csi-cloudgateway-io",
        "external-resizer-sim-csi-cloudgateway-io",
        "external-snapshotter-leader-sim-csi-cloudgateway-io",
    ] {
        for verb in ["get", "update"] {
            let own = Some(("kube-system", lease));
            assert!(may_on(&rbac, verb, leases, own), "{verb} lease {lease}");
        }
    }
    let created = Attributes::resource(
        "create",
        "coordination.k8s.io",
        "leases",
        Some("kube-system"),
        None,
    );
    assert!(rbac.check(&volume_controller(), &created).0);
    // Not the other controllers' Leases, nor kube-controller-manager's,
    // nor any Lease elsewhere.
    for lease in [
        "ccm-node-controller",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let theirs = Some(("kube-system", lease));
        assert!(!may_on(&rbac, "update", leases, theirs), "{lease}");
    }
    assert!(!may_on(
        &rbac,
        "get",
        leases,
        Some(("default", "sim-csi-cloudgateway-io"))
    ));
    // Nothing upstream leaves commented out or off: no Secrets, no group
    // snapshots; and no claim deleted.
    assert!(!may_on(&rbac, "get", "secrets", Some(("kube-system", "x"))));
    assert!(!may(
        &rbac,
        "list",
        "groupsnapshot.storage.k8s.io/volumegroupsnapshotcontents"
    ));
    assert!(!may(&rbac, "delete", "persistentvolumeclaims"));
}

#[test]
fn with_volumes_off_none_of_it_renders() {
    for docs in [render(&[]), render(&["volumes.enabled=false"])] {
        let found: Vec<String> = docs
            .iter()
            .filter(|d| {
                matches!(d["kind"].as_str(), Some("CSIDriver" | "StorageClass"))
                    || d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.contains("volume") || n.contains("csi"))
                    || d["subjects"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s["name"] == "ccm-volume-controller")
            })
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect();
        assert!(found.is_empty(), "{found:?}");
        let rbac = Rbac::from_objects(&docs);
        assert!(!may(&rbac, "create", "persistentvolumes"));
    }
}

/// Every binary a rendered container runs from the chart's image is one
/// the Dockerfile copies into it.
#[test]
fn every_binary_the_chart_runs_is_in_the_image() {
    let dockerfile = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"),
    )
    .unwrap();
    let copied = dockerfile
        .rsplit("\nFROM ")
        .next()
        .unwrap()
        .replace("\\\n", " ");
    for d in with_volumes().iter().filter(|d| d["kind"] == "Deployment") {
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            let Some(binary) = c["command"][0]
                .as_str()
                .and_then(|c| c.strip_prefix("/usr/local/bin/"))
            else {
                // An upstream image, run by its own entrypoint.
                assert!(
                    c["image"]
                        .as_str()
                        .unwrap()
                        .starts_with("registry.k8s.io/sig-storage/"),
                    "{c}"
                );
                continue;
            };
            assert!(
                copied.contains(&format!("/src/target/release/{binary} ")),
                "{}/{}: the image has no {binary}",
                d["metadata"]["name"],
                c["name"]
            );
        }
    }
}
