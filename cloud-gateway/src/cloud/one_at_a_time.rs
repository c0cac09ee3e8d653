//! One call at a time per key: the gateway is the one owner of what must
//! have one (a volume's name while it is made, an instance's device names
//! while one is picked), so calls for one key wait for each other, and
//! calls for other keys do not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedMutexGuard;

/// A lock per key, made when first asked for and forgotten when no one
/// holds or waits for it.
#[derive(Debug, Default)]
pub struct OneAtATime {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl OneAtATime {
    /// Waits until no other call holds `key`, and holds it until the guard
    /// is dropped.
    pub async fn hold(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(lock) = locks.get(key).and_then(Weak::upgrade) {
                lock
            } else {
                // Forget the locks no one holds any more, so the map
                // stays as small as what is in flight.
                locks.retain(|_, lock| lock.strong_count() > 0);
                let lock = Arc::new(tokio::sync::Mutex::new(()));
                locks.insert(key.to_owned(), Arc::downgrade(&lock));
                lock
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn calls_for_one_key_take_turns_and_other_keys_go_on() {
        let locks = Arc::new(OneAtATime::default());
        let first = locks.hold("i-1").await;
        let waiting = tokio::spawn({
            let locks = locks.clone();
            async move { drop(locks.hold("i-1").await) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "a second call for i-1 went ahead");
        drop(locks.hold("i-2").await);
        drop(first);
        waiting.await.unwrap();
        drop(locks.hold("i-3").await);
        let held = locks.locks.lock().unwrap();
        assert!(held.len() <= 1, "forgotten locks are kept: {held:?}");
    }
}
