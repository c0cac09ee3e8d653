//! Ownership by tag, the convention AWS users know from the upstream cloud
//! provider: a resource belongs to cluster `c` when it carries the tag
//! `kubernetes.io/cluster/c` with the value `owned` (created for the
//! cluster) or `shared` (used by it, created elsewhere). Nothing without
//! that tag is ever changed.

use aws_sdk_ec2::types::{Filter, Tag};

/// The prefix of the cluster tag's key. Never change it: it is how
/// existing clusters' resources are found.
pub(super) const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// The value of a resource created for the cluster.
pub(super) const OWNED: &str = "owned";
/// The value of a resource the cluster uses but did not create.
pub(super) const SHARED: &str = "shared";

/// The tag with the Service's `namespace/name` (the upstream convention).
pub(super) const TAG_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The tag with the Service's UID.
pub(super) const TAG_SERVICE_UID: &str = "cloudgateway.io/service-uid";

/// The cluster tag's key for `cluster`.
pub(super) fn cluster_key(cluster: &str) -> String {
    format!("{CLUSTER_TAG_PREFIX}{cluster}")
}

/// Whether `tags` mark a resource as `cluster`'s, owned or shared.
pub(super) fn belongs_to(tags: &[Tag], cluster: &str) -> bool {
    let key = cluster_key(cluster);
    tags.iter()
        .any(|t| t.key() == Some(key.as_str()) && matches!(t.value(), Some(OWNED | SHARED)))
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
    fn owned_and_shared_belong_other_values_and_clusters_do_not() {
        assert!(belongs_to(&[tag("kubernetes.io/cluster/a", "owned")], "a"));
        assert!(belongs_to(&[tag("kubernetes.io/cluster/a", "shared")], "a"));
        assert!(!belongs_to(&[tag("kubernetes.io/cluster/a", "yes")], "a"));
        assert!(!belongs_to(&[tag("kubernetes.io/cluster/b", "owned")], "a"));
        assert!(!belongs_to(
            &[tag("kubernetes.io/cluster/ab", "owned")],
            "a"
        ));
        assert!(!belongs_to(&[], "a"));
    }
}
