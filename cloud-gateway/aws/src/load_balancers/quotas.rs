//! The account's limits on a load balancer's targets, from both load
//! balancer APIs' `DescribeAccountLimits` (an account may have raised
//! them), with AWS's published defaults for a quota the answer does not
//! name or where the call is refused. An NLB's instance targets count in
//! its zone (500 per Availability Zone, and in every zone with cross-zone
//! load balancing on), in the load balancer (3,000) and in each target
//! group, one per Service port, each holding every host (1,000); a Classic
//! ELB's registered instances in the load balancer (1,000).

use std::collections::HashMap;

use ccm_provider::{CloudError, HostLimits, Result};

use crate::annotations::{self, LbKind};
use crate::{AwsCloud, errors};

/// AWS's published defaults, by quota name.
const PUBLISHED: &[(&str, u32)] = &[
    (NLB_PER_ZONE, 500),
    (NLB_PER_LOAD_BALANCER, 3000),
    (PER_TARGET_GROUP, 1000),
    (CLASSIC_PER_LOAD_BALANCER, 1000),
];

const NLB_PER_ZONE: &str = "targets-per-availability-zone-per-network-load-balancer";
const NLB_PER_LOAD_BALANCER: &str = "targets-per-network-load-balancer";
const PER_TARGET_GROUP: &str = "targets-per-target-group";
const CLASSIC_PER_LOAD_BALANCER: &str = "classic-registered-instances";

/// One API's answer: its limits by name, or why there are none.
type Answer = std::result::Result<HashMap<String, u32>, String>;

/// The answer's limit `name`, or the published default, with which it is.
fn quota(answer: &Answer, name: &str) -> (u32, &'static str) {
    match answer.as_ref().ok().and_then(|limits| limits.get(name)) {
        Some(n) => (*n, "the account's"),
        None => (
            PUBLISHED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap_or_default(),
            "AWS's published default",
        ),
    }
}

/// The limits of both kinds from both APIs' answers; the kind a Service
/// without the type annotation gets is `default`'s.
pub(crate) fn host_limits(default: LbKind, v2: &Answer, classic: &Answer) -> Vec<HostLimits> {
    let describe = |parts: &[(&str, (u32, &str))], answer: &Answer| {
        let mut text: Vec<String> = parts
            .iter()
            .map(|(name, (n, whose))| format!("{name} {n}, {whose}"))
            .collect();
        if let Err(why) = answer {
            text.push(format!("DescribeAccountLimits refused: {why}"));
        }
        text.join("; ")
    };
    let per_zone = quota(v2, NLB_PER_ZONE);
    let per_nlb = quota(v2, NLB_PER_LOAD_BALANCER);
    let per_group = quota(v2, PER_TARGET_GROUP);
    let per_classic = quota(classic, CLASSIC_PER_LOAD_BALANCER);
    let nlb = HostLimits {
        kind: LbKind::Nlb.as_str().into(),
        per_load_balancer: per_nlb.0.min(per_group.0),
        per_zone: per_zone.0,
        cross_zone_annotation: annotations::CROSS_ZONE.into(),
        source: describe(
            &[
                (NLB_PER_ZONE, per_zone),
                (NLB_PER_LOAD_BALANCER, per_nlb),
                (PER_TARGET_GROUP, per_group),
            ],
            v2,
        ),
        ..Default::default()
    };
    let classic = HostLimits {
        kind: LbKind::Classic.as_str().into(),
        per_load_balancer: per_classic.0,
        source: describe(&[(CLASSIC_PER_LOAD_BALANCER, per_classic)], classic),
        ..Default::default()
    };
    // The other kind is chosen by the type annotation; the default's entry
    // has none.
    let chosen = |mut limits: HostLimits| {
        limits.annotation = annotations::TYPE.into();
        limits.values = vec![limits.kind.clone()];
        limits
    };
    match default {
        LbKind::Classic => vec![chosen(nlb), classic],
        LbKind::Nlb => vec![chosen(classic), nlb],
    }
}

/// What a call that got no limits leaves: the published defaults, and
/// why. Only throttling is an error, asked again later: an API that does
/// not answer the call (refused, or not offered by an AWS-compatible
/// cloud, after the SDK's own retries) must not keep the gateway from
/// serving.
fn refused(err: CloudError) -> Result<Answer> {
    match err {
        CloudError::Throttled { .. } => Err(err),
        other => Ok(Err(other.to_string())),
    }
}

fn parse<'a>(
    limits: impl IntoIterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> HashMap<String, u32> {
    limits
        .into_iter()
        .filter_map(|(name, max)| Some((name?.to_owned(), max?.trim().parse().ok()?)))
        .collect()
}

impl AwsCloud {
    /// Both APIs' account limits, every page.
    pub(super) async fn read_host_limits(&self) -> Result<Vec<HostLimits>> {
        let v2 = every_page(|marker| async move {
            let page = self
                .elb
                .describe_account_limits()
                .set_marker(marker)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeAccountLimits", e))?;
            let limits = page.limits().iter().map(|l| (l.name(), l.max()));
            Ok((parse(limits), page.next_marker().map(str::to_owned)))
        })
        .await?;
        let classic = every_page(|marker| async move {
            let page = self
                .classic
                .describe_account_limits()
                .set_marker(marker)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeAccountLimits", e))?;
            let limits = page.limits().iter().map(|l| (l.name(), l.max()));
            Ok((parse(limits), page.next_marker().map(str::to_owned)))
        })
        .await?;
        Ok(host_limits(
            self.settings.default_load_balancer_type,
            &v2,
            &classic,
        ))
    }
}

/// Every page of one API's `DescribeAccountLimits`, each read by `page`
/// from its marker: the limits, or why there are none ([`refused`]).
async fn every_page<F>(mut page: impl FnMut(Option<String>) -> F) -> Result<Answer>
where
    F: std::future::Future<Output = Result<(HashMap<String, u32>, Option<String>)>>,
{
    let mut limits = HashMap::new();
    let mut marker = None;
    loop {
        match page(marker.take()).await {
            Ok((some, next)) => {
                limits.extend(some);
                match next {
                    Some(next) if !next.is_empty() => marker = Some(next),
                    _ => return Ok(Ok(limits)),
                }
            }
            Err(e) => return refused(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accounts_limits_win_and_the_published_fill_in() {
        let v2: Answer = Ok(HashMap::from([
            (NLB_PER_LOAD_BALANCER.to_owned(), 200),
            (NLB_PER_ZONE.to_owned(), 700),
        ]));
        let classic: Answer = Err("AccessDenied".into());
        let limits = host_limits(LbKind::Classic, &v2, &classic);
        let nlb = &limits[0];
        assert_eq!(
            (nlb.kind.as_str(), nlb.annotation.as_str()),
            ("nlb", annotations::TYPE)
        );
        assert_eq!((nlb.per_zone, nlb.per_load_balancer), (700, 200));
        assert!(
            nlb.source
                .contains("targets-per-target-group 1000, AWS's published default"),
            "{}",
            nlb.source
        );
        assert!(
            nlb.source
                .contains("targets-per-network-load-balancer 200, the account's"),
            "{}",
            nlb.source
        );
        let classic = &limits[1];
        assert_eq!(
            (classic.annotation.as_str(), classic.per_load_balancer),
            ("", 1000)
        );
        assert!(
            classic.source.contains("refused: AccessDenied"),
            "{}",
            classic.source
        );
        assert!(HostLimits::problems(&limits).is_empty());
        // With NLBs the default, the Classic ELB is the annotated kind.
        let limits = host_limits(LbKind::Nlb, &v2, &Ok(HashMap::new()));
        assert_eq!(limits[0].values, ["classic"]);
        assert_eq!(limits[1].annotation, "");
        // The smaller of the load balancer's and a target group's quota.
        assert_eq!(limits[1].per_load_balancer, 200);
    }
}
