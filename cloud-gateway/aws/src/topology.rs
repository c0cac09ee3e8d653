//! Network topology labels: `topology.k8s.aws/network-node-layer-<N>`,
//! the network nodes between an instance and the rest of its cluster
//! (`DescribeInstanceTopology`), for the instance types AWS reports them
//! for (HPC, Trainium and P types, and others AWS adds), as upstream sets
//! them.
//!
//! Upstream asks once per instance until an instance type has proven to
//! have no topology; here one request asks for up to 100 instances of a
//! lookup batch, and every answer is kept a day: an instance's layers, a
//! type without topology, a region without the API (or credentials
//! without the permission). An instance of a type upstream expects an
//! answer for (its `SupportedTopologyInstanceTypePattern`) that was never
//! answered fails its batch when AWS could not answer (throttled, down),
//! as it fails upstream's initialisation, so a transient failure never
//! lets its Node start without its labels; once answered, a failed renewal
//! keeps the last layers. Any other type goes without them and is asked
//! again a few minutes later. Labels are left off, as upstream leaves
//! them, where AWS answers that an instance has none, in regions without
//! the API, and without the permission.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Instance as Ec2Instance;
use ccm_provider::Result;

use crate::{AwsCloud, errors};

/// The labels' prefix; the layer number (1 nearest the spine) follows.
pub(super) const LABEL_NETWORK_NODE_PREFIX: &str = "topology.k8s.aws/network-node-layer-";

/// How long an answer is kept, as upstream keeps its "unsupported" ones.
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// How long a type waits after AWS could not answer for it.
const RETRY: Duration = Duration::from_secs(300);

/// How long an instance's last layers stand in when renewing them fails.
const STALE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most instance IDs one request takes.
const MAX_IDS: usize = 100;

/// Whether AWS is expected to report a topology for `instance_type`:
/// upstream's default pattern, `^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?\.[0-9a-z]*$`.
pub(super) fn requires_answer(instance_type: &str) -> bool {
    let Some((family, size)) = instance_type.split_once('.') else {
        return false;
    };
    let Some(rest) = ["hpc", "trn", "p"]
        .iter()
        .find_map(|p| family.strip_prefix(p))
    else {
        return false;
    };
    let generation = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    if generation.len() == rest.len() {
        return false;
    }
    let suffix = generation.trim_start_matches(|c: char| c.is_ascii_lowercase());
    let variant_ok = suffix.is_empty()
        || suffix.strip_prefix('-').is_some_and(|v| {
            !v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
    variant_ok
        && size
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// What is known, each answer with the time it lapses.
#[derive(Default)]
pub(super) struct Topologies {
    inner: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    /// Instance ID to its network nodes, nearest the spine first.
    layers: HashMap<String, (Instant, Vec<String>)>,
    /// Instance types, instance IDs and regions with no topology to ask for.
    none: HashMap<String, Instant>,
}

impl Known {
    fn fresh<T>(entry: Option<&(Instant, T)>) -> Option<&T> {
        entry
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, v)| v)
    }

    fn has_none(&self, key: &str) -> bool {
        self.none
            .get(key)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Whether instance `id` was ever answered (and not too long ago).
    fn answered(&self, id: &str) -> bool {
        self.layers
            .get(id)
            .is_some_and(|(until, _)| *until + STALE > Instant::now())
    }

    /// Drops what lapsed, so the maps stay as large as the cluster.
    fn prune(&mut self) {
        let now = Instant::now();
        self.none.retain(|_, until| *until > now);
        self.layers.retain(|_, (until, _)| *until + STALE > now);
    }

    /// Whether `instance` is still to be asked about in `region`.
    fn unknown(&self, region: &str, id: &str, instance_type: &str) -> bool {
        !instance_type.is_empty()
            && Self::fresh(self.layers.get(id)).is_none()
            && ![region, id, instance_type].iter().any(|k| self.has_none(k))
    }
}

impl Topologies {
    /// The labels of instance `id`, as last answered.
    pub(super) fn labels(&self, id: &str) -> BTreeMap<String, String> {
        let known = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !known.answered(id) {
            return BTreeMap::new();
        }
        known
            .layers
            .get(id)
            .map(|(_, nodes)| {
                nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (format!("{LABEL_NETWORK_NODE_PREFIX}{}", i + 1), n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn note_none(&self, key: &str, for_how_long: Duration) {
        let mut known = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        known
            .none
            .insert(key.to_owned(), Instant::now() + for_how_long);
        known.prune();
    }
}

impl AwsCloud {
    /// Asks for the topology of those `instances` not known yet.
    pub(super) async fn learn_topologies(&self, instances: &[&Ec2Instance]) -> Result<()> {
        let asked: BTreeMap<String, String> = {
            let known = self
                .topologies
                .inner
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            instances
                .iter()
                .filter_map(|i| {
                    let id = i.instance_id()?;
                    let kind = i.instance_type().map(|t| t.as_str()).unwrap_or_default();
                    known
                        .unknown(&self.region, id, kind)
                        .then(|| (id.to_owned(), kind.to_owned()))
                })
                .collect()
        };
        let ids: Vec<&String> = asked.keys().collect();
        for chunk in ids.chunks(MAX_IDS) {
            match self.describe_topology(chunk).await {
                Ok(found) => self.remember(chunk, &asked, found),
                Err(Unanswered::NotHere(why)) => {
                    tracing::info!(region = %self.region, "no network topology labels: {why}");
                    self.topologies.note_none(&self.region, KEEP);
                    return Ok(());
                }
                Err(Unanswered::Failed(e)) => {
                    let never_answered = {
                        let known = self
                            .topologies
                            .inner
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        chunk
                            .iter()
                            .any(|id| requires_answer(&asked[*id]) && !known.answered(id))
                    };
                    if never_answered {
                        return Err(e);
                    }
                    let kinds: BTreeSet<&String> = chunk.iter().map(|id| &asked[*id]).collect();
                    tracing::warn!(error = %e, "network topology unread; asked again in a few minutes");
                    for kind in kinds {
                        self.topologies.note_none(kind, RETRY);
                    }
                }
            }
        }
        Ok(())
    }

    fn remember(
        &self,
        chunk: &[&String],
        asked: &BTreeMap<String, String>,
        mut found: HashMap<String, Vec<String>>,
    ) {
        for id in chunk {
            match found.remove(*id) {
                Some(nodes) => {
                    let mut known = self
                        .topologies
                        .inner
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    known
                        .layers
                        .insert((*id).clone(), (Instant::now() + KEEP, nodes));
                    known.prune();
                }
                // A type expected to have one may yet for another
                // instance; any other type has none.
                None if requires_answer(&asked[*id]) => self.topologies.note_none(id, KEEP),
                None => self.topologies.note_none(&asked[*id], KEEP),
            }
        }
    }

    /// The network nodes of each of `ids` AWS reports, every page.
    async fn describe_topology(
        &self,
        ids: &[&String],
    ) -> std::result::Result<HashMap<String, Vec<String>>, Unanswered> {
        let ids: Vec<String> = ids.iter().map(|s| (*s).clone()).collect();
        let ids = &ids;
        let found = crate::every_page(|token| async move {
            let page = self
                .ec2
                .describe_instance_topology()
                .set_instance_ids(Some(ids.clone()))
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| match errors::code(&e) {
                    Some(code @ ("UnsupportedOperation" | "UnauthorizedOperation")) => {
                        Unanswered::NotHere(code.to_owned())
                    }
                    _ => Unanswered::Failed(errors::cloud_error("DescribeInstanceTopology", e)),
                })?;
            let found: Vec<(String, Vec<String>)> = page
                .instances()
                .iter()
                .filter_map(|t| Some((t.instance_id()?.to_owned(), t.network_nodes().to_vec())))
                .collect();
            Ok((found, page.next_token().map(str::to_owned)))
        })
        .await?;
        Ok(found.into_iter().collect())
    }
}

/// Why AWS gave no topology.
enum Unanswered {
    /// Not in this region, or not for these credentials: not asked again
    /// for a day.
    NotHere(String),
    /// Anything else: asked again later.
    Failed(ccm_provider::CloudError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_pattern_picks_the_types_expected_to_answer() {
        for t in [
            "p4d.24xlarge",
            "p5.48xlarge",
            "p5en.48xlarge",
            "p6-b200.48xlarge",
            "trn1.32xlarge",
            "trn2u.48xlarge",
            "hpc7g.16xlarge",
        ] {
            assert!(requires_answer(t), "{t}");
        }
        for t in [
            "m5.large",
            "g6.48xlarge",
            "p.large",
            "p4d",
            "p4d-.large",
            "pp4.large",
            "",
        ] {
            assert!(!requires_answer(t), "{t}");
        }
    }

    #[test]
    fn answers_are_kept_and_lapse() {
        let t = Topologies::default();
        {
            let mut known = t.inner.lock().unwrap();
            known.layers.insert(
                "i-1".into(),
                (Instant::now() + KEEP, vec!["nn-a".into(), "nn-b".into()]),
            );
            known
                .layers
                .insert("i-2".into(), (Instant::now(), vec!["nn-c".into()]));
        }
        let labels = t.labels("i-1");
        assert_eq!(labels["topology.k8s.aws/network-node-layer-1"], "nn-a");
        assert_eq!(labels["topology.k8s.aws/network-node-layer-2"], "nn-b");
        assert_eq!(
            t.labels("i-2").len(),
            1,
            "lapsed: asked again, the last layers stand in"
        );
        // (A machine up for less than a week has no instant that old.)
        let too_old = Instant::now().checked_sub(STALE + Duration::from_secs(1));
        if let Some(at) = too_old {
            let old = (at, vec!["nn-z".to_owned()]);
            t.inner.lock().unwrap().layers.insert("i-9".into(), old);
            assert!(t.labels("i-9").is_empty(), "too old to stand in");
        }
        t.note_none("m5.large", KEEP);
        let known = t.inner.lock().unwrap();
        assert!(!known.unknown("eu-west-1", "i-3", "m5.large"));
        assert!(known.unknown("eu-west-1", "i-3", "p5.48xlarge"));
        assert!(!known.unknown("eu-west-1", "i-1", "p5.48xlarge"), "known");
        assert!(
            known.unknown("eu-west-1", "i-2", "p5.48xlarge"),
            "lapsed: asked again"
        );
        assert!(
            too_old.is_none() || !known.layers.contains_key("i-9"),
            "entries too old go"
        );
    }
}
