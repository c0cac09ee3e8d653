//! What the checks share: the target, what the provider offers, the admin
//! hook, and a node with an instance. Set up once before the first check,
//! read by every check, and never changed by one.

use ccm_proto::GatewayClient;
use ccm_proto::v1::{GetProviderInfoResponse, SimInstance};

use crate::hook::Hook;
use crate::outcome::Outcome;
use crate::target::Target;

/// A service of the contract a provider may or may not offer, shown as the
/// field of `GetProviderInfoResponse` that offers it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Capability {
    Instances,
    LoadBalancers,
    Routes,
    NodeGroups,
    Volumes,
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Capability::Instances => "instances",
            Capability::LoadBalancers => "load_balancers",
            Capability::Routes => "routes",
            Capability::NodeGroups => "node_groups",
            Capability::Volumes => "volumes",
        })
    }
}

/// What the checks share.
pub(crate) struct Context {
    pub(crate) target: Target,
    /// `GetProviderInfo`'s answer to the service role, if it gave one.
    pub(crate) info: Option<GetProviderInfoResponse>,
    /// The admin hook, or why there is none.
    pub(crate) hook: Result<Hook, String>,
    /// The name of a node with an instance: the one named, or one made for
    /// the run.
    pub(crate) node: Option<String>,
    /// The instance made for the run, to terminate after the last check.
    made: Option<SimInstance>,
}

impl Context {
    /// Asks for the provider's info, probes the admin hook, and makes an
    /// instance for the run where no node is named and the hook can (and
    /// two empty node groups, where the provider has them).
    pub(crate) async fn set_up(target: &Target) -> Context {
        let info = match target.client("service", &target.cluster) {
            Ok(c) => c.provider_info().await.ok(),
            Err(_) => None,
        };
        let hook = Hook::probe(target).await;
        let mut cx = Context {
            target: target.clone(),
            info,
            hook,
            node: target.node.clone(),
            made: None,
        };
        if let (None, Ok(hook)) = (&cx.node, &cx.hook)
            && cx.offers(Capability::Instances)
            && let Ok(instance) = hook.create("conformance-node").await
        {
            cx.node = Some(instance.name.clone());
            cx.made = Some(instance);
        }
        // Node groups for the autoscaler's checks, before anything asks
        // for them: one with none of the autoscaler's options of its own,
        // one with one.
        if let Ok(hook) = &cx.hook
            && cx.offers(Capability::NodeGroups)
        {
            let cluster = &cx.target.cluster;
            let _ = hook.create_group(cluster, "conformance-plain", &[]).await;
            let _ = hook
                .create_group(
                    cluster,
                    "conformance-tuned",
                    &[("scaledownunneededtime", "7m")],
                )
                .await;
        }
        cx
    }

    /// Terminates the instance made for the run, if one was.
    pub(crate) async fn tear_down(self) {
        if let (Some(instance), Ok(hook)) = (&self.made, &self.hook) {
            let _ = hook.end(instance, true).await;
        }
    }

    /// Whether the provider said it offers `capability`.
    pub(crate) fn offers(&self, capability: Capability) -> bool {
        self.info.as_ref().is_some_and(|i| match capability {
            Capability::Instances => i.instances,
            Capability::LoadBalancers => i.load_balancers,
            Capability::Routes => i.routes,
            Capability::NodeGroups => i.node_groups,
            Capability::Volumes => i.volumes,
        })
    }

    /// The instance made for the run, if one was.
    pub(crate) fn made_instance(&self) -> Option<&SimInstance> {
        self.made.as_ref()
    }

    /// A client with `role`'s token, acting for the cluster under test.
    pub(crate) fn client(&self, role: &str) -> Result<GatewayClient, String> {
        self.target.client(role, &self.target.cluster)
    }

    /// A client with `role`'s token, acting for the other cluster.
    pub(crate) fn other_client(&self, role: &str) -> Result<GatewayClient, String> {
        self.target.client(role, &self.target.other_cluster)
    }
}

/// The skip of a check that needs a node with an instance.
pub(crate) fn no_node() -> Outcome {
    Outcome::Skip("no --node named and no admin hook to make one".into())
}
