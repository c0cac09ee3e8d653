//! The contract checks `gateway-conformance` runs against any
//! `cloudgateway.v1` gateway: each names the rule of the contract it tests
//! (`proto/CONTRACT.md` lists the rules, each with its check's name; the
//! fields are in the proto comments) and passes, fails with what it saw,
//! or is skipped with why. They use only the public gRPC contract and the
//! callers' tokens, never anything of our gateway's insides, so a vendor's
//! gateway in any language can be checked the same way.

mod checks;
mod context;
pub mod externalgrpc;
mod hook;
mod outcome;
mod target;
mod wire;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use checks::{
    auth, health, instances, load_balancers, node_groups, provider, request, routes, volumes,
};
use context::{Capability, Context};

pub use outcome::{Checked, Outcome};
pub use target::Target;
pub use wire::grpc_frame;

/// Every check, in the order [`run`] runs them. `proto/CONTRACT.md` names
/// each beside its rule.
pub const CHECKS: [&str; SUITE.len()] = {
    let mut names = [""; SUITE.len()];
    let mut i = 0;
    while i < SUITE.len() {
        names[i] = SUITE[i].name;
        i += 1;
    }
    names
};

/// Runs every check, in order; `on` sees each result as it comes.
pub async fn run(target: &Target, mut on: impl FnMut(&Checked)) -> Vec<Checked> {
    let cx = Context::set_up(target).await;
    let mut out = Vec::with_capacity(SUITE.len());
    for check in &SUITE {
        let checked = check.run(&cx).await;
        on(&checked);
        out.push(checked);
    }
    cx.tear_down().await;
    out
}

/// The suite, in the order it runs: each check with the rule it tests and
/// the capability it needs.
const SUITE: [Check; 34] = [
    Check {
        name: "health.serving",
        rule: "grpc.health.v1 answers SERVING for the server and each offered service",
        needs: None,
        body: |cx| Box::pin(health::serving(cx)),
    },
    Check {
        name: "health.reflection",
        rule: "server reflection (v1) lists the contract's services, without a token",
        needs: None,
        body: |cx| Box::pin(health::reflection(cx)),
    },
    Check {
        name: "provider.info",
        rule: "GetProviderInfo names the provider and its capabilities",
        needs: None,
        body: |cx| Box::pin(provider::info(cx)),
    },
    Check {
        name: "auth.no-token",
        rule: "a call without a valid token is UNAUTHENTICATED",
        needs: None,
        body: |cx| Box::pin(auth::no_token(cx)),
    },
    Check {
        name: "auth.wrong-role",
        rule: "a role calling a service it is not allowed is PERMISSION_DENIED",
        needs: None,
        body: |cx| Box::pin(auth::wrong_role(cx)),
    },
    Check {
        name: "provider.unimplemented",
        rule: "a capability the provider lacks answers UNIMPLEMENTED",
        needs: None,
        body: |cx| Box::pin(provider::unimplemented(cx)),
    },
    Check {
        name: "request.malformed-cluster",
        rule: "a malformed cluster name (a space, a slash) is INVALID_ARGUMENT",
        needs: None,
        body: |cx| Box::pin(request::malformed_cluster(cx)),
    },
    Check {
        name: "request.undecodable",
        rule: "bytes that are not a valid message are INVALID_ARGUMENT, and the gateway stays up",
        needs: None,
        body: |cx| Box::pin(request::undecodable(cx)),
    },
    Check {
        name: "request.deadline",
        rule: "a call still running at the caller's deadline ends with DEADLINE_EXCEEDED at that deadline",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(request::deadline(cx)),
    },
    Check {
        name: "instances.foreign-provider-id",
        rule: "a provider ID of another cloud is INVALID_ARGUMENT, never NOT_FOUND",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(instances::foreign_provider_id(cx)),
    },
    Check {
        name: "instances.not-found",
        rule: "a node the cloud has no instance for is NOT_FOUND in its own answer",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(instances::not_found(cx)),
    },
    Check {
        name: "instances.found-by-name",
        rule: "a node is found by name, with a provider ID of the provider's scheme",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(instances::found_by_name(cx)),
    },
    Check {
        name: "instances.batch-in-order",
        rule: "a batch answers every node in order; one invalid node fails the whole call, never part of it",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(instances::batch_in_order(cx)),
    },
    Check {
        name: "instances.lifecycle",
        rule: "an instance is RUNNING by name and by provider ID, SHUTDOWN once stopped, NOT_FOUND once terminated",
        needs: Some(Capability::Instances),
        body: |cx| Box::pin(instances::lifecycle(cx)),
    },
    Check {
        name: "lb.update-hosts-missing",
        rule: "updating the hosts of a load balancer that does not exist is NOT_FOUND",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::update_hosts_missing(cx)),
    },
    Check {
        name: "lb.invalid-spec",
        rule: "an invalid load balancer spec is INVALID_ARGUMENT with a BadRequest naming the field",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::invalid_spec(cx)),
    },
    Check {
        name: "lb.invalid-annotation",
        rule: "an annotation the provider refuses is INVALID_ARGUMENT naming it, and nothing is made",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::invalid_annotation(cx)),
    },
    Check {
        name: "lb.ensure-idempotent",
        rule: "ensuring twice gives one load balancer; the other cluster never sees it",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::ensure_idempotent(cx)),
    },
    Check {
        name: "lb.update-hosts",
        rule: "updating hosts changes the backends only: the load balancer and its status stay",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::update_hosts(cx)),
    },
    Check {
        name: "lb.host-limits",
        rule: "the host limits are well formed, and an ensure past them is INVALID_ARGUMENT naming hosts, making nothing",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::host_limits(cx)),
    },
    Check {
        name: "lb.provisioning",
        rule: "while provisioning, ensure is UNAVAILABLE (PROVISIONING) with a RetryInfo delay, and get shows it with no ingress",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::provisioning(cx)),
    },
    Check {
        name: "lb.delete-idempotent",
        rule: "delete succeeds when the load balancer is gone, and an ensure after it makes a new one",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::delete_idempotent(cx)),
    },
    Check {
        name: "lb.one-service-each",
        rule: "two Services whose UIDs share their first 31 hex digits never share a load balancer: the first keeps its own, untouched, through the second's ensure, host update and delete",
        needs: Some(Capability::LoadBalancers),
        body: |cx| Box::pin(load_balancers::one_service_each(cx)),
    },
    Check {
        name: "routes.delete-missing",
        rule: "deleting a route that does not exist succeeds",
        needs: Some(Capability::Routes),
        body: |cx| Box::pin(routes::delete_missing(cx)),
    },
    Check {
        name: "routes.create-idempotent",
        rule: "creating a route twice gives one route, IPv4 and IPv6; the other cluster never sees it",
        needs: Some(Capability::Routes),
        body: |cx| Box::pin(routes::create_idempotent(cx)),
    },
    Check {
        name: "routes.blackhole",
        rule: "a route whose target instance is gone is listed as a blackhole, and can be deleted",
        needs: Some(Capability::Routes),
        body: |cx| Box::pin(routes::blackhole(cx)),
    },
    Check {
        name: "node-groups.unmanaged-node",
        rule: "Cluster Autoscaler's NodeGroupForNode answers a node in no group with the empty id, never an error",
        needs: Some(Capability::NodeGroups),
        body: |cx| Box::pin(node_groups::unmanaged_node(cx)),
    },
    Check {
        name: "node-groups.unknown-group",
        rule: "a node group the gateway does not have is NOT_FOUND",
        needs: Some(Capability::NodeGroups),
        body: |cx| Box::pin(node_groups::unknown_group(cx)),
    },
    Check {
        name: "node-groups.invalid-change",
        rule: "a size change no group can take (no id, a delta of the wrong sign) is INVALID_ARGUMENT",
        needs: Some(Capability::NodeGroups),
        body: |cx| Box::pin(node_groups::invalid_change(cx)),
    },
    Check {
        name: "node-groups.pricing-unimplemented",
        rule: "pricing is UNIMPLEMENTED, which the autoscaler reads as not offered",
        needs: Some(Capability::NodeGroups),
        body: |cx| Box::pin(node_groups::pricing_unimplemented(cx)),
    },
    Check {
        name: "node-groups.both-wire-formats",
        rule: "every autoscaler release reads the same templates and options: the wire formats before 1.35 and from 1.35 on, in one answer",
        needs: Some(Capability::NodeGroups),
        body: |cx| Box::pin(node_groups::both_wire_formats(cx)),
    },
    Check {
        name: "volumes.create-idempotent",
        rule: "a volume's name makes one volume, ALREADY_EXISTS for another size, out of another cluster's sight",
        needs: Some(Capability::Volumes),
        body: |cx| Box::pin(volumes::create_idempotent(cx)),
    },
    Check {
        name: "volumes.delete-missing",
        rule: "deleting a volume that does not exist succeeds",
        needs: Some(Capability::Volumes),
        body: |cx| Box::pin(volumes::delete_missing(cx)),
    },
    Check {
        name: "volumes.one-device-owner",
        rule: "two attaches to one instance at once get two devices; again, the same; an attached volume is not deleted",
        needs: Some(Capability::Volumes),
        body: |cx| Box::pin(volumes::one_device_owner(cx)),
    },
];

/// One check of the suite: what it is called, the rule it tests, the
/// capability without which it is skipped, and how it is done.
struct Check {
    name: &'static str,
    rule: &'static str,
    needs: Option<Capability>,
    body: for<'a> fn(&'a Context) -> Body<'a>,
}

/// A check under way: it passes, skips, or fails with what it saw.
type Body<'a> = Pin<Box<dyn Future<Output = Result<Outcome, String>> + Send + 'a>>;

impl Check {
    /// Runs the check, or skips it, unstarted, where the provider lacks
    /// what it needs.
    async fn run(&self, cx: &Context) -> Checked {
        let outcome = match self.needs {
            Some(capability) if !cx.offers(capability) => {
                Outcome::Skip(format!("the provider has no {capability} capability"))
            }
            _ => (self.body)(cx).await.unwrap_or_else(Outcome::Fail),
        };
        Checked {
            name: self.name,
            rule: self.rule,
            outcome,
        }
    }
}

/// The summary line, and whether every check passed or was skipped.
pub fn summary(results: &[Checked]) -> (String, bool) {
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    let failed = count(|o| matches!(o, Outcome::Fail(_)));
    (
        format!(
            "{} checks: {} passed, {failed} failed, {} skipped",
            results.len(),
            count(|o| *o == Outcome::Pass),
            count(|o| matches!(o, Outcome::Skip(_))),
        ),
        failed == 0,
    )
}

/// Runs the `gateway-conformance` binary in `bin_dir` against `address`
/// with the role tokens in `tokens`, acting for `cluster`, with more flags
/// in `args` (`--node`, `--invalid-annotation`).
pub async fn run_binary(
    bin_dir: &std::path::Path,
    address: &str,
    tokens: &std::path::Path,
    cluster: &str,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(bin_dir.join("gateway-conformance"));
    command
        .args([
            "--address",
            address,
            "--cluster",
            cluster,
            "--patience",
            "60",
        ])
        .arg("--tokens-dir")
        .arg(tokens)
        .args(args);
    Ok(tokio::time::timeout(Duration::from_secs(300), command.output()).await??)
}
