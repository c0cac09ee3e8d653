//! EBS modifications, one ModifyVolume for what is asked together. EBS
//! makes one modification of a volume at a time, refusing another until
//! it is done (and, in AWS, for six hours after). A claim whose size and
//! VolumeAttributesClass are edited at once reaches the gateway as two
//! calls, a resize and a change, from two controllers of the resizer; made
//! one after the other, the second would be refused for hours. So the
//! first to ask for a volume waits a moment ([`WINDOW`]) for others, and
//! what they all asked is made by one ModifyVolume, whose answer each
//! gets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_ec2::types::VolumeType;
use ccm_provider::{CloudError, Result};
use tokio::sync::oneshot;

use super::errors;

/// How long the first request for a volume waits for others to join it:
/// upstream's EBS controller waits as long (its
/// `--modify-volume-request-handler-timeout`). EBS takes minutes to make
/// a modification; this adds little.
pub const WINDOW: Duration = Duration::from_secs(2);

/// What one ModifyVolume asks of a volume; `None` keeps a value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub size_gib: Option<i32>,
    pub volume_type: Option<String>,
    pub iops: Option<i32>,
    pub throughput: Option<i32>,
}

impl Target {
    /// This and `other` at once: the larger size (a resize asks for at
    /// least its size); a value both name differently is refused, named
    /// as this one has it, and nothing is merged.
    fn merge(&mut self, other: &Target) -> std::result::Result<(), String> {
        fn one<T: PartialEq + Clone + std::fmt::Display>(
            name: &str,
            mine: &mut Option<T>,
            theirs: &Option<T>,
        ) -> std::result::Result<(), String> {
            match (&*mine, theirs) {
                (Some(a), Some(b)) if a != b => Err(format!("{name} {a}")),
                (None, Some(b)) => {
                    *mine = Some(b.clone());
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        let mut merged = self.clone();
        merged.size_gib = self.size_gib.max(other.size_gib);
        one("type", &mut merged.volume_type, &other.volume_type)?;
        one("iops", &mut merged.iops, &other.iops)?;
        one("throughput", &mut merged.throughput, &other.throughput)?;
        *self = merged;
        Ok(())
    }
}

/// What a modification answers: the size EBS grows the volume to, in GiB,
/// where the modification asked for one.
type Answer = Result<Option<i32>>;

/// The requests for one volume waiting for its window to close.
struct Batch {
    target: Target,
    waiters: Vec<oneshot::Sender<Answer>>,
}

/// The modifications waiting for their window, by volume ID.
#[derive(Clone)]
pub struct Modifications {
    pending: Arc<Mutex<HashMap<String, Batch>>>,
    window: Duration,
}

impl Default for Modifications {
    fn default() -> Self {
        Self {
            pending: Arc::default(),
            window: WINDOW,
        }
    }
}

impl Modifications {
    /// Asks `ec2` for `target` on `volume_id`, with whatever else is asked
    /// of it within the window. A value that contradicts one asked in the
    /// window is refused as `Provisioning` (ask again once that one is
    /// made).
    pub async fn ask(&self, ec2: &aws_sdk_ec2::Client, volume_id: &str, target: Target) -> Answer {
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut pending = self.pending.lock().expect("modifications lock");
            match pending.get_mut(volume_id) {
                Some(batch) => {
                    batch.target.merge(&target).map_err(|asked| {
                        errors::provisioning(format!(
                            "volume {volume_id}: a modification to {asked} is being made"
                        ))
                    })?;
                    batch.waiters.push(tx);
                    false
                }
                None => {
                    let batch = Batch {
                        target,
                        waiters: vec![tx],
                    };
                    pending.insert(volume_id.to_owned(), batch);
                    true
                }
            }
        };
        if first {
            // The modification is made whether or not the first caller
            // still waits: the others may.
            let pending = Arc::clone(&self.pending);
            let (ec2, window, volume_id) = (ec2.clone(), self.window, volume_id.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                let batch = pending
                    .lock()
                    .expect("modifications lock")
                    .remove(&volume_id);
                if let Some(batch) = batch {
                    let answer = modify(&ec2, &volume_id, &batch.target).await;
                    for waiter in batch.waiters {
                        let _ = waiter.send(answer.clone());
                    }
                }
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(errors::provisioning(format!(
                "volume {volume_id}: the modification was cut short"
            )))
        })
    }
}

/// One ModifyVolume.
async fn modify(ec2: &aws_sdk_ec2::Client, volume_id: &str, target: &Target) -> Answer {
    let answer = ec2
        .modify_volume()
        .volume_id(volume_id)
        .set_size(target.size_gib)
        .set_volume_type(target.volume_type.as_deref().map(VolumeType::from))
        .set_iops(target.iops)
        .set_throughput(target.throughput)
        .send()
        .await
        .map_err(|e| modification_error(volume_id, e))?;
    Ok(answer
        .volume_modification()
        .and_then(|m| m.target_size())
        .or(target.size_gib))
}

/// What a refused ModifyVolume (a resize or a change) means: the volume
/// gone, or one modification still being made, which the resizer asks
/// again after (EBS makes one at a time).
fn modification_error<E, R>(volume_id: &str, e: aws_sdk_ec2::error::SdkError<E, R>) -> CloudError
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + 'static,
{
    match errors::code(&e) {
        Some("InvalidVolume.NotFound") => CloudError::NotFound(format!("volume {volume_id}")),
        Some("IncorrectModificationState") => {
            errors::provisioning(format!("volume {volume_id} is still being modified"))
        }
        _ => errors::cloud_error("ModifyVolume", e),
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn what_is_asked_together_merges_unless_it_contradicts() {
        let resize = Target {
            size_gib: Some(20),
            ..Default::default()
        };
        let change = Target {
            volume_type: Some("io2".into()),
            iops: Some(6000),
            ..Default::default()
        };
        let mut both = resize.clone();
        both.merge(&change).unwrap();
        assert_eq!(
            both,
            Target {
                size_gib: Some(20),
                volume_type: Some("io2".into()),
                iops: Some(6000),
                throughput: None,
            }
        );
        // A second resize asks for at least its size: the larger wins.
        both.merge(&Target {
            size_gib: Some(10),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(both.size_gib, Some(20));
        // A different type is refused, and nothing of it is merged.
        let before = both.clone();
        let refused = both.merge(&Target {
            volume_type: Some("gp3".into()),
            throughput: Some(250),
            ..Default::default()
        });
        assert_eq!(refused, Err("type io2".to_owned()));
        assert_eq!(both, before);
    }
}
