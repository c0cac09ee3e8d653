//! The admin hook: the subset of `SimAdmin` a gateway offers the `admin`
//! token to act as the cloud's console would (create, stop and terminate
//! instances; create empty node groups; make calls slow and load balancers
//! slow to provision).

use ccm_proto::AuthorizedChannel;
use ccm_proto::v1::sim_admin_client::SimAdminClient;
use ccm_proto::v1::{
    CreateInstanceRequest, CreateNodeGroupRequest, Faults, GetFaultsRequest, InstanceId,
    SimInstance,
};

use crate::target::Target;

/// A client of the admin hook, known to answer.
#[derive(Clone)]
pub(crate) struct Hook(SimAdminClient<AuthorizedChannel>);

impl Hook {
    /// The hook, or why there is none (no admin token, or the gateway does
    /// not serve it to that token).
    pub(crate) async fn probe(target: &Target) -> Result<Hook, String> {
        let client = target
            .client("admin", &target.cluster)
            .map_err(|_| "no admin token, so no admin hook".to_owned())?;
        let mut admin =
            SimAdminClient::new(client.authorized_channel().map_err(|e| e.to_string())?);
        match admin.get_faults(GetFaultsRequest {}).await {
            Ok(_) => Ok(Hook(admin)),
            Err(status) => Err(format!(
                "the gateway offers no admin hook (GetFaults: {:?})",
                status.code()
            )),
        }
    }

    /// Makes an instance named `prefix` and a random suffix.
    pub(crate) async fn create(&self, prefix: &str) -> Result<SimInstance, String> {
        let name = format!("{prefix}-{:08x}", fastrand::u32(..));
        self.0
            .clone()
            .create_instance(CreateInstanceRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|e| format!("admin hook: create instance {name}: {}", e.message()))
    }

    /// Makes an empty node group of `cluster` named `prefix` and a random
    /// suffix, with Cluster Autoscaler's `options` (by name); it stays, as
    /// empty groups cost nothing.
    pub(crate) async fn create_group(
        &self,
        cluster: &str,
        prefix: &str,
        options: &[(&str, &str)],
    ) -> Result<(), String> {
        let id = format!("{prefix}-{:08x}", fastrand::u32(..));
        self.0
            .clone()
            .create_node_group(CreateNodeGroupRequest {
                cluster_name: cluster.to_owned(),
                id: id.clone(),
                max_size: 1,
                autoscaling_options: options
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..Default::default()
            })
            .await
            .map(drop)
            .map_err(|e| format!("admin hook: create node group {id}: {}", e.message()))
    }

    /// Stops the instance (it still exists), or terminates it for good.
    pub(crate) async fn end(&self, instance: &SimInstance, terminate: bool) -> Result<(), String> {
        let mut admin = self.0.clone();
        let id = InstanceId {
            id: instance.id.clone(),
        };
        let (verb, done) = if terminate {
            ("terminate", admin.terminate_instance(id).await.map(|_| ()))
        } else {
            ("stop", admin.stop_instance(id).await.map(|_| ()))
        };
        done.map_err(|e| format!("admin hook: {verb} {}: {}", instance.id, e.message()))
    }

    /// Changes the injected faults; returns the ones before, to restore.
    pub(crate) async fn faults(&self, change: impl FnOnce(&mut Faults)) -> Result<Faults, String> {
        let mut admin = self.0.clone();
        let before = admin
            .get_faults(GetFaultsRequest {})
            .await
            .map_err(|e| format!("admin hook: get faults: {}", e.message()))?
            .into_inner();
        let mut faults = before.clone();
        change(&mut faults);
        self.set_faults(faults).await?;
        Ok(before)
    }

    /// Sets the injected faults, as [`Hook::faults`] returned them, say.
    pub(crate) async fn set_faults(&self, faults: Faults) -> Result<(), String> {
        self.0
            .clone()
            .set_faults(faults)
            .await
            .map(|_| ())
            .map_err(|e| format!("admin hook: set faults: {}", e.message()))
    }
}
