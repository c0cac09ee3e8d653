//! Ownership by tag, the convention AWS users know from the upstream cloud
//! provider: a resource belongs to cluster `c` when it carries the tag
//! `kubernetes.io/cluster/c` (`owned`: created for the cluster; `shared`:
//! used by it, created elsewhere; upstream reads any value as the
//! cluster's, and so do we), or the legacy tag `KubernetesCluster=c` of
//! clusters older than Kubernetes 1.6. Nothing without either is ever
//! changed. What the gateway makes carries the new tag, `owned`.
//! Everything made for a Service also carries its name and UID
//! (`service_tags`).

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{Filter, Tag};
use ccm_provider::ServiceRef;

/// The prefix of the cluster tag's key. Never change it: it is how
/// existing clusters' resources are found.
pub(super) const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// The legacy cluster tag's key; its value is the cluster's name.
pub(super) const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";
/// The value of a resource created for the cluster.
pub(super) const OWNED: &str = "owned";

/// The tag with the Service's `namespace/name` (the upstream convention).
pub(super) const TAG_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The tag with the Service's UID.
pub(super) const TAG_SERVICE_UID: &str = "cloudgateway.io/service-uid";

/// The most values one EC2 filter takes.
pub(super) const FILTER_VALUES: usize = 200;

/// The cluster tag's key for `cluster`.
pub(super) fn cluster_key(cluster: &str) -> String {
    format!("{CLUSTER_TAG_PREFIX}{cluster}")
}

/// Whether the tags `pairs` (key, value) mark a resource as `cluster`'s:
/// the cluster tag with any value, or the legacy tag naming the cluster.
pub(super) fn marks_cluster<'a>(
    mut pairs: impl Iterator<Item = (Option<&'a str>, Option<&'a str>)>,
    cluster: &str,
) -> bool {
    let key = cluster_key(cluster);
    pairs.any(|(k, v)| {
        k == Some(key.as_str()) || (k == Some(LEGACY_CLUSTER_TAG) && v == Some(cluster))
    })
}

/// Whether the EC2 `tags` mark a resource as `cluster`'s.
pub(super) fn belongs_to(tags: &[Tag], cluster: &str) -> bool {
    marks_cluster(tags.iter().map(|t| (t.key(), t.value())), cluster)
}

/// The tags of everything made for `service`: the `extra` tags the
/// Service asks for, then the cluster tag (`owned`) and the Service's
/// `namespace/name` and UID.
pub(super) fn service_tags(
    cluster: &str,
    service: &ServiceRef,
    extra: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    out.push((cluster_key(cluster), OWNED.to_owned()));
    out.push((
        TAG_SERVICE_NAME.to_owned(),
        format!("{}/{}", service.namespace, service.name),
    ));
    out.push((TAG_SERVICE_UID.to_owned(), service.uid.clone()));
    out
}

/// The Service a load balancer serves, from its tags' values: the
/// `namespace/name` of [`TAG_SERVICE_NAME`] and the UID of
/// [`TAG_SERVICE_UID`] (none on one cloud-provider-aws made until our
/// first ensure tags it).
pub(super) fn service_of(service_name: Option<&str>, uid: Option<&str>) -> ServiceRef {
    let (namespace, name) = service_name
        .and_then(|v| v.split_once('/'))
        .unwrap_or_default();
    ServiceRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.unwrap_or_default().to_owned(),
    }
}

/// Whose a load balancer (or a part of one) is, as its Service tags say
/// against one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ServedBy {
    /// That Service's: its `namespace/name` and, where the UID tag is
    /// there (cloud-provider-aws writes none), its UID.
    This,
    /// Another Service's, described for a message.
    Another(String),
    /// No Service tag at all: whose cannot be told.
    Unnamed,
}

/// Whom the tag values `service_name` ([`TAG_SERVICE_NAME`]) and `uid`
/// ([`TAG_SERVICE_UID`]) name, as against `service`. A resource is taken
/// over only when they name it: a load balancer named after the UID may be
/// another Service's whose UID begins alike.
pub(super) fn served_by(
    service_name: Option<&str>,
    uid: Option<&str>,
    service: &ServiceRef,
) -> ServedBy {
    let own_name = format!("{}/{}", service.namespace, service.name);
    match (service_name, uid) {
        (None, None) => ServedBy::Unnamed,
        (Some(n), None) if n == own_name => ServedBy::This,
        (Some(n), Some(u)) if n == own_name && u == service.uid => ServedBy::This,
        // Our UID tag alone: UIDs are never reused.
        (None, Some(u)) if u == service.uid => ServedBy::This,
        (n, u) => ServedBy::Another(format!(
            "Service {}{}",
            n.unwrap_or("(no name tag)"),
            u.map(|u| format!(" (UID {u})")).unwrap_or_default()
        )),
    }
}

/// The prefix of the names cloud-provider-aws gives an NLB's target
/// groups and its managed security group: `k8s-`, the first 8 letters and
/// digits of the namespace and of the name, each followed by `-`.
pub(super) fn upstream_name_prefix(service: &ServiceRef) -> String {
    let eight = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    format!(
        "k8s-{}-{}-",
        eight(&service.namespace),
        eight(&service.name)
    )
}

/// An EC2 filter on `name` with `values`.
pub(super) fn filter(name: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(Into::into).collect()))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(key: &str, value: &str) -> Tag {
        Tag::builder().key(key).value(value).build()
    }

    #[test]
    fn only_tags_naming_the_service_and_where_present_its_uid_make_it_its() {
        let first = ServiceRef {
            namespace: "default".into(),
            name: "first".into(),
            uid: "36300001-0000-0000-0000-000000000001".into(),
        };
        let uid = first.uid.as_str();
        let other = "36300001-0000-0000-0000-000000000002";
        let this = |n, u| served_by(n, u, &first) == ServedBy::This;
        assert!(this(Some("default/first"), Some(uid)), "ours");
        assert!(this(Some("default/first"), None), "cloud-provider-aws's");
        assert!(this(None, Some(uid)));
        assert!(
            !this(Some("default/first"), Some(other)),
            "a Service of that name before"
        );
        assert!(!this(Some("default/second"), Some(uid)));
        assert!(!this(Some("default/second"), None));
        assert!(!this(Some("first"), None));
        assert_eq!(served_by(None, None, &first), ServedBy::Unnamed);
        assert_eq!(
            served_by(Some("default/second"), Some(other), &first),
            ServedBy::Another(format!("Service default/second (UID {other})"))
        );
    }

    #[test]
    fn the_cluster_tag_or_the_legacy_tag_marks_the_clusters_never_anothers() {
        assert!(belongs_to(&[tag("kubernetes.io/cluster/a", "owned")], "a"));
        assert!(belongs_to(&[tag("kubernetes.io/cluster/a", "shared")], "a"));
        assert!(
            belongs_to(&[tag("kubernetes.io/cluster/a", "1")], "a"),
            "any value, as upstream"
        );
        assert!(!belongs_to(&[tag("kubernetes.io/cluster/b", "owned")], "a"));
        assert!(!belongs_to(
            &[tag("kubernetes.io/cluster/ab", "owned")],
            "a"
        ));
        assert!(!belongs_to(&[], "a"));
        let kops = "full-scale.k8s.Example_1";
        assert!(belongs_to(&[tag(&cluster_key(kops), "owned")], kops));
        assert!(belongs_to(&[tag("KubernetesCluster", kops)], kops));
        assert!(!belongs_to(&[tag("KubernetesCluster", "other")], kops));
        assert!(!belongs_to(&[tag(kops, "KubernetesCluster")], kops));
    }
}
