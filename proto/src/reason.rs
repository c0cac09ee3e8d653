//! Machine-readable reasons carried in `google.rpc.ErrorInfo` details. The
//! gateway writes them and the client reads them; both sides use these
//! constants, so they never drift. The strings are part of the wire contract:
//! never change one.

/// The `ErrorInfo.domain` of every error the gateway produces.
pub const DOMAIN: &str = "cloudgateway.v1";

/// A named cloud resource (instance, load balancer, route) does not exist.
pub const NOT_FOUND: &str = "NOT_FOUND";
/// The provider does not implement this capability.
pub const NOT_IMPLEMENTED: &str = "NOT_IMPLEMENTED";
/// The provider hands this object off to another implementation (upstream's
/// `ImplementedElsewhere`); callers treat it as a no-op.
pub const IMPLEMENTED_ELSEWHERE: &str = "IMPLEMENTED_ELSEWHERE";
/// A load balancer is still being provisioned; ask again after the delay.
pub const PROVISIONING: &str = "PROVISIONING";
/// The cloud throttled the gateway; ask again after the delay.
pub const CLOUD_THROTTLED: &str = "CLOUD_THROTTLED";
/// The gateway's own API budget has no room for this call in time.
pub const BUDGET_EXHAUSTED: &str = "BUDGET_EXHAUSTED";
/// The cloud did not answer or failed; nothing is known about the resource.
pub const CLOUD_UNAVAILABLE: &str = "CLOUD_UNAVAILABLE";
/// The gateway's cloud credentials are not allowed to do this.
pub const CLOUD_PERMISSION_DENIED: &str = "CLOUD_PERMISSION_DENIED";
/// The caller's role may not call this RPC.
pub const ROLE_NOT_ALLOWED: &str = "ROLE_NOT_ALLOWED";
/// The request conflicts with an existing resource.
pub const CONFLICT: &str = "CONFLICT";
/// The load balancer address pool has no free address.
pub const ADDRESS_POOL_EXHAUSTED: &str = "ADDRESS_POOL_EXHAUSTED";
/// The cloud account is at one of its quotas (load balancers, target
/// groups, listeners, security group rules); an operator must raise it or
/// free some.
pub const CLOUD_QUOTA_EXCEEDED: &str = "CLOUD_QUOTA_EXCEEDED";
/// A request field is invalid; the `BadRequest` detail names it.
pub const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";
/// The cloud account is not set up for the request (e.g. no route table
/// carries the cluster's tag); an operator must act, retrying will not help.
pub const CLOUD_NOT_CONFIGURED: &str = "CLOUD_NOT_CONFIGURED";
/// The gateway is at one of its limits on connections, requests or bytes
/// in flight; ask again after the delay.
pub const GATEWAY_BUSY: &str = "GATEWAY_BUSY";
/// A volume is attached to another instance (or, to delete it, to any);
/// detach it first.
pub const VOLUME_IN_USE: &str = "VOLUME_IN_USE";
/// A volume and an instance are in different zones; a volume attaches
/// only to instances of its own zone.
pub const ZONE_MISMATCH: &str = "ZONE_MISMATCH";
/// An instance has as many volumes attached as it can take.
pub const ATTACH_LIMIT: &str = "ATTACH_LIMIT";
