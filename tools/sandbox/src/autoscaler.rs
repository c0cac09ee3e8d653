//! A real Cluster Autoscaler in the sandbox (`sandbox --cluster-autoscaler
//! PATH`, or `CLUSTER_AUTOSCALER` in the environment): the stock binary,
//! built with its `externalgrpc` provider, run as a cluster would run it
//! against the API server and the gateway. It reads the cloud-config the
//! chart writes (the gateway's address, the autoscaler's client
//! certificate, which the gateway maps to the `autoscaler` role, and the
//! CA), elects a leader with a Lease, writes its status ConfigMap, and has
//! one node group to scale: on the sim [`GROUP`], empty, whose instances'
//! kubelets register Nodes labelled [`GROUP_LABEL`]; on AWS the Auto
//! Scaling groups `aws::seed_node_groups` makes. Its log is
//! `cluster-autoscaler.log` beside the others.

use std::path::Path;

use anyhow::Context as _;
use ccm_proto::v1::CreateNodeGroupRequest;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;

use crate::{CloudKind, NAMESPACE, Sandbox};

/// Its process name, log and ServiceAccount (as upstream's chart names it).
pub const NAME: &str = "cluster-autoscaler";
/// The sim node group it scales: from zero to five.
pub const GROUP: &str = "workers";
/// The label its nodes register with (`--node-labels`), which a Pod
/// selects to be scheduled on them.
pub const GROUP_LABEL: (&str, &str) = ("pool", "workers");
/// The variable the binary's path may come from.
pub const ENV: &str = "CLUSTER_AUTOSCALER";

/// Its flags here: a loop every 5 s, nodes unneeded for a minute go; the
/// sandbox's own cloud-config, kubeconfig and namespace; its metrics and
/// health port (plain HTTP, upstream's) on loopback at `port`. Options'
/// `extra_args["cluster-autoscaler"]` come after, so they win.
fn args(state: &Path, port: u16) -> Vec<String> {
    [
        "--cloud-provider=externalgrpc".to_owned(),
        format!("--address=127.0.0.1:{port}"),
        format!(
            "--cloud-config={}",
            state.join("autoscaler-cloud-config.yaml").display()
        ),
        format!(
            "--kubeconfig={}",
            state.join(format!("kubeconfig-{NAME}")).display()
        ),
        format!("--namespace={NAMESPACE}"),
        "--scan-interval=5s".to_owned(),
        "--scale-down-unneeded-time=1m".to_owned(),
        "--scale-down-delay-after-add=1m".to_owned(),
        "--max-node-provision-time=2m".to_owned(),
        "--v=2".to_owned(),
    ]
    .into()
}

/// What upstream's chart grants Cluster Autoscaler, applied when the
/// sandbox enforces RBAC (the chart's own grants it nothing).
const RBAC: &str = r#"
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: cluster-autoscaler}
  rules:
    - {apiGroups: [""], resources: [events, endpoints], verbs: [create, patch]}
    - {apiGroups: [""], resources: [pods/eviction], verbs: [create]}
    - {apiGroups: [""], resources: [pods/status], verbs: [update]}
    - {apiGroups: [""], resources: [endpoints], resourceNames: [cluster-autoscaler], verbs: [get, update]}
    - {apiGroups: [""], resources: [nodes], verbs: [watch, list, get, update]}
    - {apiGroups: [""], resources: [namespaces, pods, services, replicationcontrollers, persistentvolumeclaims, persistentvolumes], verbs: [watch, list, get]}
    - {apiGroups: [batch], resources: [jobs, cronjobs], verbs: [watch, list, get]}
    - {apiGroups: [batch, extensions], resources: [jobs], verbs: [get, list, patch, watch]}
    - {apiGroups: [apps], resources: [daemonsets, replicasets, statefulsets], verbs: [watch, list, get]}
    - {apiGroups: [policy], resources: [poddisruptionbudgets], verbs: [watch, list]}
    - {apiGroups: [storage.k8s.io], resources: [storageclasses, csinodes, csidrivers, csistoragecapacities], verbs: [watch, list, get]}
    - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}
    - {apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [cluster-autoscaler], verbs: [get, update]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: cluster-autoscaler}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-autoscaler}
  subjects: [{kind: ServiceAccount, name: cluster-autoscaler, namespace: kube-system}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: cluster-autoscaler, namespace: kube-system}
  rules:
    - {apiGroups: [""], resources: [configmaps], verbs: [create, list, watch]}
    - {apiGroups: [""], resources: [configmaps], resourceNames: [cluster-autoscaler-status, cluster-autoscaler-priority-expander], verbs: [delete, get, update, watch]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: cluster-autoscaler, namespace: kube-system}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cluster-autoscaler}
  subjects: [{kind: ServiceAccount, name: cluster-autoscaler, namespace: kube-system}]
"#;

impl Sandbox {
    /// Makes the node group, grants the autoscaler what upstream's chart
    /// grants it where RBAC is enforced, and starts `binary`.
    pub(crate) async fn start_autoscaler(&mut self, binary: &Path) -> anyhow::Result<()> {
        anyhow::ensure!(
            binary.is_file(),
            "no Cluster Autoscaler binary at {} (--cluster-autoscaler or {ENV})",
            binary.display()
        );
        match self.options.cloud {
            CloudKind::Sim => {
                let mut admin = self.admin()?.sim_admin()?;
                // The gateway may still be starting.
                let request = CreateNodeGroupRequest {
                    cluster_name: self.options.cluster.clone(),
                    id: GROUP.into(),
                    min_size: 0,
                    max_size: 5,
                    target_size: 0,
                    instance_type: "sim.standard-2".into(),
                    labels: [(GROUP_LABEL.0.to_owned(), GROUP_LABEL.1.to_owned())].into(),
                    ..Default::default()
                };
                let mut tries = 0;
                while let Err(e) = admin.create_node_group(request.clone()).await {
                    tries += 1;
                    anyhow::ensure!(
                        e.code() == tonic::Code::Unavailable && tries < 100,
                        "create node group {GROUP}: {e}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
            CloudKind::Aws => {
                let aws = self.aws.as_ref().context("the AWS sandbox has no moto")?;
                crate::aws::seed_node_groups(
                    &aws.moto.endpoint,
                    &aws.seeded,
                    &self.options.cluster,
                )
                .await?;
            }
            CloudKind::Toy => anyhow::bail!("the toy gateway has no node groups to scale"),
        }
        if self.options.rbac.is_some() {
            self.grant_autoscaler().await?;
        }
        let state = self.options.state_dir.clone();
        let binary = binary.canonicalize()?.display().to_string();
        let port = crate::ports::free_port()?;
        let args: Vec<String> = args(&state, port)
            .into_iter()
            .chain(self.extra_args(NAME))
            .collect();
        self.spawn(NAME, &binary, &args, &[])?;
        self.endpoints.insert(
            "cluster_autoscaler_log".into(),
            state.join(format!("{NAME}.log")).display().to_string(),
        );
        Ok(())
    }

    /// Applies [`RBAC`] as an administrator would install the chart.
    async fn grant_autoscaler(&self) -> anyhow::Result<()> {
        let client = self.client().await?;
        let objects: Vec<serde_json::Value> = serde_norway::from_str(RBAC)?;
        for object in objects {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let resource = ApiResource::from_gvk_with_plural(
                &kube::core::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", &kind),
                &format!("{}s", kind.to_lowercase()),
            );
            let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            let object: DynamicObject = serde_json::from_value(object)?;
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).context(format!("grant the autoscaler its {kind}")),
            }
        }
        Ok(())
    }
}
