//! The cloud's limits on a load balancer's backend hosts, as a provider
//! states them (`GetProviderInfo`'s `host_limits`) and as both sides read
//! them: the service controller, to choose hosts within them, and the
//! provider, to refuse what is past them before any write.

use std::collections::{BTreeMap, HashMap};

/// A Service's annotations, however they are kept: the provider API's
/// spec holds a `HashMap`, a Kubernetes Service a `BTreeMap`. Read in
/// place, never copied.
pub trait Annotations {
    /// The value of annotation `key`.
    fn annotation(&self, key: &str) -> Option<&str>;
}

impl Annotations for HashMap<String, String> {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Annotations for BTreeMap<String, String> {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// The limits of one kind of load balancer. A limit of 0 is none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostLimits {
    /// The kind's name, as messages name it ("nlb").
    pub kind: String,
    /// The Service annotation whose value chooses this kind; empty for
    /// the kind of every Service no other entry matches.
    pub annotation: String,
    /// The annotation's values that choose it, compared without case.
    pub values: Vec<String>,
    /// The most hosts of one load balancer.
    pub per_load_balancer: u32,
    /// The most hosts of one load balancer in one zone.
    pub per_zone: u32,
    /// The annotation that, "true", turns on cross-zone load balancing,
    /// under which `per_zone` limits the hosts of all zones together.
    pub cross_zone_annotation: String,
    /// Where the limits come from (the quotas' names), for messages.
    pub source: String,
}

/// What the limits allow one Service's load balancer: `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allowed {
    /// Hosts in any one zone.
    pub per_zone: Option<u32>,
    /// Hosts in all.
    pub total: Option<u32>,
}

fn limit(n: u32) -> Option<u32> {
    (n > 0).then_some(n)
}

impl HostLimits {
    /// The entry of `limits` for a Service with `annotations`: the first
    /// whose annotation has one of its values, else the one without an
    /// annotation.
    pub fn of_service<'a>(
        limits: &'a [HostLimits],
        annotations: &impl Annotations,
    ) -> Option<&'a HostLimits> {
        limits
            .iter()
            .find(|l| {
                !l.annotation.is_empty()
                    && annotations.annotation(&l.annotation).is_some_and(|v| {
                        l.values
                            .iter()
                            .any(|want| want.eq_ignore_ascii_case(v.trim()))
                    })
            })
            .or_else(|| limits.iter().find(|l| l.annotation.is_empty()))
    }

    /// Whether the Service's annotations turn cross-zone load balancing on.
    pub fn cross_zone(&self, annotations: &impl Annotations) -> bool {
        !self.cross_zone_annotation.is_empty()
            && annotations
                .annotation(&self.cross_zone_annotation)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// What these limits allow a Service with `annotations`.
    pub fn allowed(&self, annotations: &impl Annotations) -> Allowed {
        let per_zone = limit(self.per_zone);
        let total = limit(self.per_load_balancer);
        if self.cross_zone(annotations) {
            let all = match (per_zone, total) {
                (Some(z), Some(t)) => Some(z.min(t)),
                (z, t) => z.or(t),
            };
            Allowed {
                per_zone: all,
                total: all,
            }
        } else {
            Allowed { per_zone, total }
        }
    }

    /// Checks hosts, given by their zones (empty for unknown), against the
    /// limits for a Service with `annotations`: the first quota they are
    /// past, named, as an error.
    pub fn check<'a>(
        &self,
        annotations: &impl Annotations,
        zones: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), String> {
        let allowed = self.allowed(annotations);
        let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
        let mut total = 0u32;
        for zone in zones {
            *per_zone.entry(zone).or_default() += 1;
            total += 1;
        }
        let source = if self.source.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.source)
        };
        if let Some(most) = allowed.total
            && total > most
        {
            let cross = if self.cross_zone(annotations) {
                " with cross-zone load balancing"
            } else {
                ""
            };
            return Err(format!(
                "{total} hosts exceed the {} quota of {most} hosts per load balancer{cross}{source}",
                self.kind
            ));
        }
        if let Some(most) = allowed.per_zone
            && let Some((zone, n)) = per_zone
                .iter()
                .find(|(zone, n)| !zone.is_empty() && **n > most)
        {
            return Err(format!(
                "{n} hosts in zone {zone} exceed the {} quota of {most} hosts per zone{source}",
                self.kind
            ));
        }
        Ok(())
    }

    /// What is wrong with a provider's list of limits, if anything: two
    /// entries without an annotation, or two of one kind.
    pub fn problems(limits: &[HostLimits]) -> Vec<String> {
        let mut out = Vec::new();
        if limits.iter().filter(|l| l.annotation.is_empty()).count() > 1 {
            out.push("more than one entry has no annotation".to_owned());
        }
        let mut kinds: Vec<&str> = limits.iter().map(|l| l.kind.as_str()).collect();
        kinds.sort_unstable();
        if let Some(w) = kinds.windows(2).find(|w| w[0] == w[1]) {
            out.push(format!("kind {:?} is listed twice", w[0]));
        }
        if let Some(l) = limits.iter().find(|l| l.kind.is_empty()) {
            out.push(format!("an entry ({:?}) has no kind", l.annotation));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nlb() -> HostLimits {
        HostLimits {
            kind: "nlb".into(),
            annotation: "type".into(),
            values: vec!["nlb".into()],
            per_load_balancer: 3000,
            per_zone: 500,
            cross_zone_annotation: "cross-zone".into(),
            source: "published defaults".into(),
        }
    }

    fn classic() -> HostLimits {
        HostLimits {
            kind: "classic".into(),
            per_load_balancer: 1000,
            ..Default::default()
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_service_gets_the_kind_its_annotation_names_or_the_default() {
        let limits = [nlb(), classic()];
        let of = |pairs| HostLimits::of_service(&limits, &annotations(pairs)).map(|l| &l.kind);
        assert_eq!(of(&[("type", "NLB")]).map(String::as_str), Some("nlb"));
        assert_eq!(
            of(&[("type", "other")]).map(String::as_str),
            Some("classic")
        );
        assert_eq!(of(&[]).map(String::as_str), Some("classic"));
        assert_eq!(HostLimits::of_service(&[nlb()], &annotations(&[])), None);
    }

    #[test]
    fn cross_zone_makes_the_zone_quota_the_whole_load_balancers() {
        let limits = nlb();
        assert_eq!(
            limits.allowed(&annotations(&[])),
            Allowed {
                per_zone: Some(500),
                total: Some(3000)
            }
        );
        let cross = annotations(&[("cross-zone", "true")]);
        assert_eq!(
            limits.allowed(&cross),
            Allowed {
                per_zone: Some(500),
                total: Some(500)
            }
        );
        assert_eq!(classic().allowed(&cross).per_zone, None);
    }

    #[test]
    fn the_check_names_the_quota_a_host_set_is_past() {
        let limits = nlb();
        let zones = |a: usize, b: usize| {
            std::iter::repeat_n("zone-a", a)
                .chain(std::iter::repeat_n("zone-b", b))
                .collect::<Vec<_>>()
        };
        assert_eq!(limits.check(&annotations(&[]), zones(500, 500)), Ok(()));
        let err = limits.check(&annotations(&[]), zones(501, 1)).unwrap_err();
        assert!(err.contains("501 hosts in zone zone-a"), "{err}");
        assert!(err.contains("nlb quota of 500 hosts per zone"), "{err}");
        assert!(err.contains("published defaults"), "{err}");
        let cross = annotations(&[("cross-zone", "true")]);
        let err = limits.check(&cross, zones(300, 300)).unwrap_err();
        assert!(err.contains("600 hosts exceed"), "{err}");
        assert!(err.contains("with cross-zone load balancing"), "{err}");
        // Hosts of no known zone count only in all.
        assert_eq!(limits.check(&annotations(&[]), vec![""; 600]), Ok(()));
    }

    #[test]
    fn a_list_with_two_defaults_or_a_kind_twice_is_wrong() {
        assert!(HostLimits::problems(&[nlb(), classic()]).is_empty());
        let problems = HostLimits::problems(&[classic(), classic()]);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
