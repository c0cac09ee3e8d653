//! Which instances a load balancer sends traffic to, whatever its kind:
//! the pending or running instances behind the hosts the Service selects.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Instance as Ec2Instance;
use ccm_provider::{Host, Result};

use crate::AwsCloud;
use crate::annotations::LbOptions;
use crate::instances::parse_provider_id;
use crate::tags::{self, FILTER_VALUES};

/// The instance IDs of `targets`.
pub(super) fn instance_ids(targets: &[Ec2Instance]) -> BTreeSet<String> {
    targets
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_owned))
        .collect()
}

impl AwsCloud {
    /// The running target instances among `hosts` that the Service selects.
    pub(super) async fn target_instances(
        &self,
        hosts: &[Host],
        o: &LbOptions,
    ) -> Result<Vec<Ec2Instance>> {
        let ids: Vec<String> = hosts
            .iter()
            .filter(|h| o.selects(&h.labels))
            .filter_map(|h| match parse_provider_id(&h.provider_id) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::debug!(host = %h.name, error = %e, "host is no NLB target");
                    None
                }
            })
            .collect();
        let mut out = Vec::new();
        for chunk in ids.chunks(FILTER_VALUES) {
            out.extend(
                self.describe_instances(vec![
                    tags::filter("instance-id", chunk.iter().cloned()),
                    tags::filter("instance-state-name", ["pending", "running"]),
                ])
                .await?,
            );
        }
        Ok(out)
    }
}
