//! What kube-apiserver does to a Service on update besides storing it
//! (`pkg/registry/core/service`): it keeps the values it allocated that the
//! request left out, drops the fields the new `type` has no use for, and
//! refuses the ones the request set where the type forbids them. The
//! store allocates and releases node ports after (see `store`).
//!
//! All work on the JSON form, where an absent field, `null`, `0` and `""`
//! are Go's zero values.

use serde_json::{Map, Value, json};

fn spec(svc: &Value) -> &Value {
    &svc["spec"]
}

fn text<'a>(svc: &'a Value, field: &str) -> &'a str {
    spec(svc)[field].as_str().unwrap_or_default()
}

/// The Service's type; `ClusterIP` when unset, as defaulting makes it.
pub fn kind(svc: &Value) -> &str {
    match text(svc, "type") {
        "" => "ClusterIP",
        t => t,
    }
}

/// Every type but ExternalName has cluster IPs (even `None` counts).
pub fn needs_cluster_ip(svc: &Value) -> bool {
    kind(svc) != "ExternalName"
}

/// NodePort and LoadBalancer Services have node ports.
pub fn needs_node_port(svc: &Value) -> bool {
    matches!(kind(svc), "NodePort" | "LoadBalancer")
}

/// A LoadBalancer Service that keeps traffic on the node it arrives at
/// (`externalTrafficPolicy: Local`) has a health check node port.
pub fn needs_hc_node_port(svc: &Value) -> bool {
    kind(svc) == "LoadBalancer" && text(svc, "externalTrafficPolicy") == "Local"
}

/// The node ports of the Service's ports, zeros left out.
pub fn node_ports(svc: &Value) -> Vec<i64> {
    spec(svc)["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| p["nodePort"].as_i64())
                .filter(|np| *np != 0)
                .collect()
        })
        .unwrap_or_default()
}

/// The health check node port, if set.
pub fn hc_node_port(svc: &Value) -> Option<i64> {
    spec(svc)["healthCheckNodePort"]
        .as_i64()
        .filter(|p| *p != 0)
}

fn spec_mut(svc: &mut Value) -> Option<&mut Map<String, Value>> {
    svc.get_mut("spec")?.as_object_mut()
}

/// Go's zero value: absent, `null`, `""`, `0` or `[]`.
fn zero(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Whether `field` of the spec is the same in both (zero values alike).
fn same(old: &Value, new: &Value, field: &str) -> bool {
    let (a, b) = (spec(old).get(field), spec(new).get(field));
    (zero(a) && zero(b)) || a == b
}

/// Fills in what an update left out that the server allocated, so that a
/// client may send a Service without them (kube-apiserver's
/// `patchAllocatedValues`, run before anything else on update):
///
/// - `clusterIP` and `clusterIPs`, when both old and new have cluster IPs;
/// - each port's `nodePort`, when both types have node ports: the old
///   port of the same name's, unless another new port already uses it;
/// - `healthCheckNodePort`, when both need one.
pub fn patch_allocated_values(old: &Value, new: &mut Value) {
    let both_cluster_ip = needs_cluster_ip(old) && needs_cluster_ip(new);
    let both_node_ports = needs_node_port(old) && needs_node_port(new);
    let both_hc = needs_hc_node_port(old) && needs_hc_node_port(new);
    let old_hc = hc_node_port(old);
    let old_ports = node_ports(old);
    let used: Vec<i64> = node_ports(new)
        .into_iter()
        .filter(|p| old_ports.contains(p))
        .collect();
    let by_name: Vec<(String, i64)> = spec(old)["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_owned(),
                        p["nodePort"].as_i64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let old_spec = spec(old).clone();
    let Some(s) = spec_mut(new) else { return };
    if both_cluster_ip {
        for field in ["clusterIP", "clusterIPs"] {
            if zero(s.get(field)) && !zero(old_spec.get(field)) {
                s.insert(field.into(), old_spec[field].clone());
            }
        }
    }
    if both_node_ports && let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if !zero(p.get("nodePort")) {
                continue;
            }
            let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            // The last old port of that name, as Go's map of them keeps.
            let old_value = by_name
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, np)| *np);
            if old_value != 0 && !used.contains(&old_value) {
                p.insert("nodePort".into(), json!(old_value));
            }
        }
    }
    if both_hc
        && zero(s.get("healthCheckNodePort"))
        && let Some(hc) = old_hc
    {
        s.insert("healthCheckNodePort".into(), json!(hc));
    }
}

/// Drops what the Service's new type has no use for, as kube-apiserver's
/// `dropTypeDependentFields` does on every update (never on create). A
/// field is dropped only when the old type used it, the new one does not,
/// and the request left it as it was (a changed value is the user's, and
/// validation refuses it, see [`validate`]):
///
/// - leaving every type with cluster IPs (to ExternalName): `clusterIP`
///   and `clusterIPs` (if both unchanged), `ipFamilies`, `ipFamilyPolicy`
///   (each if unchanged);
/// - leaving NodePort or LoadBalancer for a type without node ports: every
///   port's `nodePort`, if the new ports bring no node port the old ones
///   did not have (ports may be added, removed or changed otherwise);
/// - no longer LoadBalancer with `externalTrafficPolicy: Local`:
///   `healthCheckNodePort`, if unchanged;
/// - leaving LoadBalancer: `allocateLoadBalancerNodePorts`, if set in both
///   and equal; `loadBalancerClass`, if unchanged (both unset counts);
/// - leaving NodePort or LoadBalancer for a type without node ports:
///   `externalTrafficPolicy`, if unchanged;
/// - any type but LoadBalancer: `status.loadBalancer` is emptied.
///
/// Fields such as `selector` stay, as there.
pub fn drop_type_dependent_fields(old: &Value, new: &mut Value) {
    let drop_cluster_ips = needs_cluster_ip(old) && !needs_cluster_ip(new);
    let same_cluster_ips = same(old, new, "clusterIP") && same(old, new, "clusterIPs");
    let same_families = same(old, new, "ipFamilies");
    let same_family_policy = same(old, new, "ipFamilyPolicy");
    let old_ports = node_ports(old);
    let drop_node_ports = needs_node_port(old)
        && !needs_node_port(new)
        && node_ports(new).iter().all(|p| old_ports.contains(p));
    let drop_hc = needs_hc_node_port(old)
        && !needs_hc_node_port(new)
        && hc_node_port(old) == hc_node_port(new);
    let leaving_lb = kind(old) == "LoadBalancer" && kind(new) != "LoadBalancer";
    let allocate = "allocateLoadBalancerNodePorts";
    let drop_allocate = leaving_lb
        && spec(old)[allocate].is_boolean()
        && spec(old)[allocate] == spec(new)[allocate];
    let drop_class = leaving_lb && same(old, new, "loadBalancerClass");
    let drop_etp =
        needs_node_port(old) && !needs_node_port(new) && same(old, new, "externalTrafficPolicy");
    let lb = kind(new) == "LoadBalancer";
    if let Some(s) = spec_mut(new) {
        let mut remove = Vec::new();
        if drop_cluster_ips {
            if same_cluster_ips {
                remove.extend(["clusterIP", "clusterIPs"]);
            }
            if same_families {
                remove.push("ipFamilies");
            }
            if same_family_policy {
                remove.push("ipFamilyPolicy");
            }
        }
        if drop_hc {
            remove.push("healthCheckNodePort");
        }
        if drop_allocate {
            remove.push(allocate);
        }
        if drop_class {
            remove.push("loadBalancerClass");
        }
        if drop_etp {
            remove.push("externalTrafficPolicy");
        }
        for field in remove {
            s.remove(field);
        }
        if drop_node_ports && let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                p.remove("nodePort");
            }
        }
    }
    if !lb && let Some(status) = new.get_mut("status").and_then(Value::as_object_mut) {
        status.insert("loadBalancer".into(), json!({}));
    }
}

/// The defaults kube-apiserver gives a Service on every write
/// (`SetDefaults_Service`, for the fields this server defaults): type
/// ClusterIP, session affinity None, each port's protocol TCP and target
/// port its port, internal traffic policy Cluster (but for
/// ExternalName), external traffic policy Cluster for NodePort and
/// LoadBalancer.
pub fn default(svc: &mut Value) {
    let external = needs_node_port(svc);
    let external_name = kind(svc) == "ExternalName";
    let Some(s) = spec_mut(svc) else { return };
    if zero(s.get("type")) {
        s.insert("type".into(), json!("ClusterIP"));
    }
    if zero(s.get("sessionAffinity")) {
        s.insert("sessionAffinity".into(), json!("None"));
    }
    if !external_name && zero(s.get("internalTrafficPolicy")) {
        s.insert("internalTrafficPolicy".into(), json!("Cluster"));
    }
    if external && zero(s.get("externalTrafficPolicy")) {
        s.insert("externalTrafficPolicy".into(), json!("Cluster"));
    }
    if let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if zero(p.get("protocol")) {
                p.insert("protocol".into(), json!("TCP"));
            }
            if zero(p.get("targetPort"))
                && let Some(port) = p.get("port").cloned()
            {
                p.insert("targetPort".into(), port);
            }
        }
    }
}

/// What kube-apiserver's validation refuses of the fields that depend on
/// the type, with its messages: node ports on a ClusterIP Service; a
/// health check node port but on a LoadBalancer with
/// `externalTrafficPolicy: Local`; an external traffic policy on a
/// Service not reachable from outside (neither NodePort nor LoadBalancer
/// nor with `externalIPs`); `loadBalancerClass` or
/// `allocateLoadBalancerNodePorts` but on a LoadBalancer.
pub fn validate(svc: &Value) -> Result<(), String> {
    let mut errors = Vec::new();
    if kind(svc) == "ClusterIP" {
        for (i, p) in spec(svc)["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !zero(p.get("nodePort")) {
                errors.push(format!(
                    "spec.ports[{i}].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
                ));
            }
        }
    }
    if let Some(hc) = hc_node_port(svc)
        && !needs_hc_node_port(svc)
    {
        errors.push(format!("spec.healthCheckNodePort: Invalid value: {hc}: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"));
    }
    let externally_accessible =
        needs_node_port(svc) || (kind(svc) == "ClusterIP" && !zero(spec(svc).get("externalIPs")));
    let etp = text(svc, "externalTrafficPolicy");
    if !etp.is_empty() && !externally_accessible {
        errors.push(format!(
            "spec.externalTrafficPolicy: Invalid value: {etp:?}: may only be set for externally-accessible services"
        ));
    }
    if kind(svc) != "LoadBalancer" {
        for field in ["loadBalancerClass", "allocateLoadBalancerNodePorts"] {
            if !spec(svc)[field].is_null() {
                errors.push(format!(
                    "spec.{field}: Forbidden: may only be used when `type` is 'LoadBalancer'"
                ));
            }
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(format!("[{}]", errors.join(", "))),
    }
}

/// Everything kube-apiserver does to an updated Service before its node
/// ports are allocated: [`patch_allocated_values`], [`default`],
/// [`drop_type_dependent_fields`], then [`validate`].
pub fn prepare_update(old: &Value, new: &mut Value) -> Result<(), String> {
    patch_allocated_values(old, new);
    default(new);
    drop_type_dependent_fields(old, new);
    validate(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb() -> Value {
        json!({
            "spec": {
                "type": "LoadBalancer",
                "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "ports": [{"name": "http", "port": 80, "nodePort": 30001, "protocol": "TCP", "targetPort": 80}],
                "externalTrafficPolicy": "Local", "healthCheckNodePort": 30002,
                "allocateLoadBalancerNodePorts": true, "loadBalancerClass": "example.com/lb",
                "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}},
        })
    }

    fn with(mut svc: Value, changes: Value) -> Value {
        json_patch::merge(&mut svc, &changes);
        svc
    }

    #[test]
    fn leaving_load_balancer_for_cluster_ip_drops_what_only_it_uses() {
        let old = lb();
        let mut new = with(old.clone(), json!({"spec": {"type": "ClusterIP"}}));
        prepare_update(&old, &mut new).unwrap();
        let spec = &new["spec"];
        assert!(spec["ports"][0].get("nodePort").is_none(), "{spec}");
        for gone in [
            "healthCheckNodePort",
            "allocateLoadBalancerNodePorts",
            "loadBalancerClass",
            "externalTrafficPolicy",
        ] {
            assert!(spec.get(gone).is_none(), "{gone}: {spec}");
        }
        for kept in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            assert!(spec.get(kept).is_some(), "{kept}: {spec}");
        }
        assert_eq!(new["status"]["loadBalancer"], json!({}));
    }

    #[test]
    fn a_field_the_request_changed_is_not_dropped_and_validation_says_why() {
        let old = lb();
        let mut new = with(
            old.clone(),
            json!({"spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "nodePort": 30009}]}}),
        );
        let err = prepare_update(&old, &mut new).unwrap_err();
        assert!(
            err.contains(
                "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
            ),
            "{err}"
        );
        // A changed class or traffic policy stays, and is refused.
        let mut new = with(
            old.clone(),
            json!({"spec": {"type": "ClusterIP", "loadBalancerClass": "other.com/lb"}}),
        );
        let err = prepare_update(&old, &mut new).unwrap_err();
        assert!(err.contains("spec.loadBalancerClass: Forbidden"), "{err}");
        let mut new = with(
            old.clone(),
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": "Cluster"}}),
        );
        let err = prepare_update(&old, &mut new).unwrap_err();
        assert!(
            err.contains("spec.externalTrafficPolicy: Invalid value: \"Cluster\""),
            "{err}"
        );
        // Fewer node ports than before is no new node port: they go.
        let mut old2 = old.clone();
        old2["spec"]["ports"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "https", "port": 443, "nodePort": 30003}));
        let mut new = with(old2.clone(), json!({"spec": {"type": "ClusterIP"}}));
        new["spec"]["ports"].as_array_mut().unwrap().remove(0);
        prepare_update(&old2, &mut new).unwrap();
        assert!(new["spec"]["ports"][0].get("nodePort").is_none());
    }

    #[test]
    fn load_balancer_to_node_port_keeps_node_ports_and_drops_the_rest() {
        let old = lb();
        let mut new = with(old.clone(), json!({"spec": {"type": "NodePort"}}));
        prepare_update(&old, &mut new).unwrap();
        let spec = &new["spec"];
        assert_eq!(spec["ports"][0]["nodePort"], 30001);
        assert_eq!(
            spec["externalTrafficPolicy"], "Local",
            "NodePort uses it too"
        );
        assert!(spec.get("healthCheckNodePort").is_none());
        assert!(spec.get("allocateLoadBalancerNodePorts").is_none());
        assert!(spec.get("loadBalancerClass").is_none());
        // Local to Cluster on a LoadBalancer drops the health check port.
        let mut new = with(
            old.clone(),
            json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
        );
        prepare_update(&old, &mut new).unwrap();
        assert!(new["spec"].get("healthCheckNodePort").is_none());
        assert_eq!(new["spec"]["loadBalancerClass"], "example.com/lb");
    }

    #[test]
    fn external_name_drops_cluster_ips_and_families() {
        let old = with(
            lb(),
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null, "healthCheckNodePort": null,
                "allocateLoadBalancerNodePorts": null, "loadBalancerClass": null,
                "ports": [{"name": "http", "port": 80}]}}),
        );
        let mut new = with(
            old.clone(),
            json!({"spec": {"type": "ExternalName", "externalName": "example.com"}}),
        );
        prepare_update(&old, &mut new).unwrap();
        for gone in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            assert!(new["spec"].get(gone).is_none(), "{gone}");
        }
    }

    #[test]
    fn an_update_without_allocated_values_keeps_them() {
        let old = lb();
        let mut new = with(
            old.clone(),
            json!({"spec": {"clusterIP": null, "clusterIPs": null, "healthCheckNodePort": null,
                "ports": [{"name": "http", "port": 80}]}}),
        );
        prepare_update(&old, &mut new).unwrap();
        let spec = &new["spec"];
        assert_eq!(spec["clusterIP"], "10.96.0.1");
        assert_eq!(spec["clusterIPs"], json!(["10.96.0.1"]));
        assert_eq!(spec["ports"][0]["nodePort"], 30001);
        assert_eq!(spec["ports"][0]["targetPort"], 80);
        assert_eq!(spec["healthCheckNodePort"], 30002);
    }
}
