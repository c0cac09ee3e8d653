//! Where a Service's load balancer of each kind is, among the names it
//! may have (`ccm_provider::load_balancer_names`): upstream's, then its
//! own. Two Services whose UIDs share their first 31 hex digits share
//! upstream's name, so a load balancer found by name is the Service's
//! only when its tags name the Service (`tags::served_by`); one that is
//! another Service's, another cluster's, or nobody's that can be told is
//! never used, changed or deleted: the Service's own goes under the next
//! free name.

use aws_sdk_elasticloadbalancing::types::{LoadBalancerDescription as Elb, Tag as ClassicTag};
use aws_sdk_elasticloadbalancingv2::types::{LoadBalancer as Nlb, Tag};
use ccm_provider::{CloudError, Result, ServiceRef, load_balancer_names};

use super::classic::classic_tag_value;
use super::elb_tags::tag_value;
use crate::AwsCloud;
use crate::tags::{ServedBy, TAG_SERVICE_NAME, TAG_SERVICE_UID, served_by};

/// A Service's load balancer of one kind, `L` (the load balancer with its
/// tags), among its names.
pub(super) struct Slot<L> {
    /// The Service's own, under `own_name`.
    pub(super) own: Option<L>,
    own_name: Option<String>,
    /// Names under which no load balancer of this kind exists.
    free: Vec<String>,
    /// Names held by a load balancer that is not the Service's, with why.
    held: Vec<(String, String)>,
}

impl<L> Default for Slot<L> {
    fn default() -> Self {
        Self {
            own: None,
            own_name: None,
            free: Vec::new(),
            held: Vec::new(),
        }
    }
}

impl<L> Slot<L> {
    /// Takes what was found under `name`; true once it is the Service's
    /// own (nothing further to look at).
    fn take(&mut self, name: String, found: Result<Option<(L, ServedBy)>>) -> Result<bool> {
        match found {
            Ok(Some((lb, ServedBy::This))) => {
                self.own = Some(lb);
                self.own_name = Some(name);
                return Ok(true);
            }
            Ok(Some((_, ServedBy::Another(whose)))) => self
                .held
                .push((name, format!("the load balancer of {whose}"))),
            Ok(Some((_, ServedBy::Unnamed))) => self.held.push((
                name,
                "a load balancer whose tags name no Service".to_owned(),
            )),
            Ok(None) => self.free.push(name),
            // Another cluster's (no tag of this one).
            Err(CloudError::Conflict(why)) => self.held.push((name, why)),
            Err(e) => return Err(e),
        }
        Ok(false)
    }

    /// The name the Service's load balancer has, or the one a new one
    /// gets. `Conflict` naming the holders when every name is held.
    pub(super) fn name(&self) -> Result<String> {
        self.own_name
            .as_ref()
            .or(self.free.first())
            .cloned()
            .ok_or_else(|| {
                CloudError::Conflict(format!(
                    "every name this Service's load balancer may have is taken: {}; those are left untouched",
                    self.holders()
                ))
            })
    }

    /// The names under which what a load balancer of this kind leaves
    /// (its group, the nodes' rules for it) is the Service's to clean up:
    /// its own's, and those no other load balancer holds.
    pub(super) fn cleanable(&self) -> impl Iterator<Item = &str> {
        self.own_name.iter().chain(&self.free).map(String::as_str)
    }

    /// The first name held by a load balancer that is not the Service's,
    /// and whose it is, as a sentence; `None` when none is.
    pub(super) fn held_name(&self) -> Option<String> {
        let (name, whose) = self.held.first()?;
        Some(format!("{name} is {whose}"))
    }

    fn holders(&self) -> String {
        self.held
            .iter()
            .map(|(name, whose)| format!("{name} is {whose}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl AwsCloud {
    /// The Service's NLB among its names.
    pub(super) async fn nlb_slot(
        &self,
        cluster: &str,
        service: &ServiceRef,
    ) -> Result<Slot<(Nlb, Vec<Tag>)>> {
        let mut slot = Slot::default();
        for name in load_balancer_names(&service.uid) {
            let found = self.owned_nlb(cluster, &name).await.map(|o| {
                o.map(|(nlb, t)| {
                    let by = served_by(
                        tag_value(&t, TAG_SERVICE_NAME),
                        tag_value(&t, TAG_SERVICE_UID),
                        service,
                    );
                    ((nlb, t), by)
                })
            });
            if slot.take(name, found)? {
                break;
            }
        }
        Ok(slot)
    }

    /// The Service's Classic ELB among its names.
    pub(super) async fn classic_slot(
        &self,
        cluster: &str,
        service: &ServiceRef,
    ) -> Result<Slot<(Elb, Vec<ClassicTag>)>> {
        let mut slot = Slot::default();
        for name in load_balancer_names(&service.uid) {
            let found = self.owned_classic(cluster, &name).await.map(|o| {
                o.map(|(elb, t)| {
                    let by = served_by(
                        classic_tag_value(&t, TAG_SERVICE_NAME),
                        classic_tag_value(&t, TAG_SERVICE_UID),
                        service,
                    );
                    ((elb, t), by)
                })
            });
            if slot.take(name, found)? {
                break;
            }
        }
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_of(found: Vec<Result<Option<(u8, ServedBy)>>>) -> Result<Slot<u8>> {
        let mut slot = Slot::default();
        for (i, f) in found.into_iter().enumerate() {
            if slot.take(format!("n{i}"), f)? {
                break;
            }
        }
        Ok(slot)
    }

    #[test]
    fn a_name_held_by_another_service_is_passed_over_and_never_cleaned() {
        let other = || Ok(Some((1, ServedBy::Another("Service default/first".into()))));
        // Upstream's name is the other's: a new one goes under its own.
        let s = slot_of(vec![other(), Ok(None)]).unwrap();
        assert!(s.own.is_none());
        assert_eq!(s.name().unwrap(), "n1");
        assert_eq!(s.cleanable().collect::<Vec<_>>(), ["n1"]);
        assert_eq!(
            s.held_name().unwrap(),
            "n0 is the load balancer of Service default/first"
        );
        // Its own found under its own name.
        let s = slot_of(vec![other(), Ok(Some((2, ServedBy::This)))]).unwrap();
        assert_eq!((s.own, s.name().unwrap()), (Some(2), "n1".to_owned()));
        // Upstream's free but its own under its own name: that one, not a
        // second (the other Service's is gone since).
        let s = slot_of(vec![Ok(None), Ok(Some((2, ServedBy::This)))]).unwrap();
        assert_eq!((s.own, s.name().unwrap()), (Some(2), "n1".to_owned()));
        // Both held, by a Service and by a load balancer naming none.
        let s = slot_of(vec![other(), Ok(Some((3, ServedBy::Unnamed)))]).unwrap();
        let e = s.name().unwrap_err().to_string();
        assert!(
            e.contains("default/first") && e.contains("name no Service"),
            "{e}"
        );
        assert_eq!(s.cleanable().count(), 0);
        // Another cluster's is held too; a cloud error is the answer.
        let s = slot_of(vec![Err(CloudError::Conflict("x".into())), Ok(None)]).unwrap();
        assert_eq!(s.name().unwrap(), "n1");
        assert!(slot_of(vec![Err(CloudError::Unavailable("down".into()))]).is_err());
    }

    #[test]
    fn the_first_name_is_taken_when_free_and_the_own_ends_the_search() {
        let s = slot_of(vec![Ok(None), Ok(None)]).unwrap();
        assert_eq!(s.name().unwrap(), "n0");
        assert_eq!(s.cleanable().collect::<Vec<_>>(), ["n0", "n1"]);
        let s = slot_of(vec![Ok(Some((1, ServedBy::This))), Ok(None)]).unwrap();
        assert_eq!(s.cleanable().collect::<Vec<_>>(), ["n0"]);
    }
}
