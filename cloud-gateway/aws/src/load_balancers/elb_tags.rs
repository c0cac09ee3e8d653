//! Tags of ELBv2 resources (NLBs and target groups): writing them, reading
//! them in batches, and telling by them which resources are the cluster's
//! (the ownership rule of `tags.rs`, in ELBv2's tag type).

use std::collections::{BTreeMap, HashMap};

use aws_sdk_elasticloadbalancingv2::types::Tag;
use ccm_provider::Result;

use crate::{AwsCloud, errors, tags};

/// How many ARNs one `DescribeTags` takes.
const TAGS_PER_CALL: usize = 20;

/// `pairs` as ELBv2 tags.
pub(super) fn elb_tags_of(pairs: &[(String, String)]) -> Vec<Tag> {
    pairs
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// Whether `tags` mark a resource as `cluster`'s ([`tags::marks_cluster`]).
pub(super) fn elb_belongs(tags: &[Tag], cluster: &str) -> bool {
    tags::marks_cluster(tags.iter().map(|t| (t.key(), t.value())), cluster)
}

/// The value of the tag `key`, if any.
pub(super) fn tag_value<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

impl AwsCloud {
    /// Tags of each ARN.
    pub(super) async fn elb_tags(&self, arns: &[String]) -> Result<HashMap<String, Vec<Tag>>> {
        let mut out = HashMap::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            let answer = self
                .elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeTags", e))?;
            for d in answer.tag_descriptions() {
                if let Some(arn) = d.resource_arn() {
                    out.insert(arn.to_owned(), d.tags().to_vec());
                }
            }
        }
        Ok(out)
    }

    /// Adds to the resource `arn` those of `want` whose key it lacks in
    /// `have`, and those of `extra` (the Service's own tags) whose value
    /// differs; other values it has are left as they are, and no tag is
    /// removed, as upstream leaves them. The cluster tag goes with every
    /// `AddTags`, as the IAM policy asks.
    pub(super) async fn sync_elb_tags(
        &self,
        arn: &str,
        have: &[Tag],
        want: &[(String, String)],
        extra: &BTreeMap<String, String>,
    ) -> Result<()> {
        let needed = |k: &str, v: &str| match tag_value(have, k) {
            None => true,
            Some(now) => extra.contains_key(k) && now != v,
        };
        if !want.iter().any(|(k, v)| needed(k, v)) {
            return Ok(());
        }
        let adding: Vec<(String, String)> = want
            .iter()
            .filter(|(k, v)| needed(k, v) || k.starts_with(tags::CLUSTER_TAG_PREFIX))
            .cloned()
            .collect();
        self.elb
            .add_tags()
            .resource_arns(arn)
            .set_tags(Some(elb_tags_of(&adding)))
            .send()
            .await
            .map_err(|e| errors::cloud_error("AddTags", e))?;
        Ok(())
    }

    /// Those of `items` tagged for `cluster`, each with its tags.
    pub(super) async fn owned_by<T>(
        &self,
        cluster: &str,
        items: Vec<T>,
        arn: fn(&T) -> Option<&str>,
    ) -> Result<Vec<(T, Vec<Tag>)>> {
        let arns: Vec<String> = items
            .iter()
            .filter_map(|i| arn(i).map(str::to_owned))
            .collect();
        let mut tags = self.elb_tags(&arns).await?;
        Ok(items
            .into_iter()
            .filter_map(|i| {
                let t = tags.remove(arn(&i)?)?;
                elb_belongs(&t, cluster).then_some((i, t))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_and_shared_belong_and_a_tag_value_is_found_by_key() {
        let tags = elb_tags_of(&[
            ("kubernetes.io/cluster/a".into(), "owned".into()),
            ("team".into(), "web".into()),
        ]);
        assert!(elb_belongs(&tags, "a"));
        assert!(!elb_belongs(&tags, "b"));
        let shared = elb_tags_of(&[("kubernetes.io/cluster/b".into(), "shared".into())]);
        assert!(elb_belongs(&shared, "b"));
        assert_eq!(tag_value(&tags, "team"), Some("web"));
        assert_eq!(tag_value(&tags, "owner"), None);
    }
}
