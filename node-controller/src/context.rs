//! What every part of the node controller shares.

use ccm_proto::GatewayClient;
use ccm_proto::v1::{InstanceResult, LookupPurpose, NodeRef};
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use ccm_runtime::view::Views;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::events::Recorder;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::metrics::{GatewayLabels, Metrics};

/// The shared state of one node controller process.
pub struct Context {
    pub nodes: Api<Node>,
    /// What the controller keeps of each Node.
    pub store: Views<crate::plan::NodeView>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    /// For events each object gets once (`controller::publish_once`).
    pub client: kube::Client,
    pub reporter: kube::runtime::events::Reporter,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    pub queue: WorkQueue<String>,
    /// Initialised nodes whose addresses and event are still to write.
    pub finishing: Finishing,
    /// The most instances one of the gateway's cloud calls looks up (0:
    /// it did not say); read at start.
    pub instance_batch: std::sync::atomic::AtomicUsize,
    /// The tagging controller, when `--instance-tags` names tags.
    pub tagging: Option<crate::tagging::Tagging>,
    /// The serving CSR approver, when `--approve-kubelet-serving-csrs`.
    pub csrs: Option<crate::serving_csrs::ServingCsrs>,
    /// The deletions the mass-deletion safeguard held back in the last
    /// lifecycle pass, if it held any.
    pub held_back: std::sync::Mutex<Option<HeldBack>>,
}

/// What is left to write of a node initialised: its addresses and event.
pub struct Initialised {
    pub node: crate::plan::NodeView,
    pub instance: ccm_proto::v1::Instance,
    /// When its taint came off: what a term before this one left is
    /// not written (the address sync at the term's start reads afresh).
    pub at: tokio::time::Instant,
}

/// Initialised nodes whose addresses and event wait to be written.
const FINISHING_QUEUED: usize = 8192;

/// How long an initialised node's addresses and event wait at most for
/// the initialisations in flight to end.
pub const FINISHING_WAITS_AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);

/// The lane of initialised nodes whose addresses and event are still to
/// write (`reconcile::finish_initialised`), behind the taints: a joining
/// node is schedulable once its taint is gone, and these two writes per
/// node, written by the worker that removed the taint, took two thirds of
/// the API server's writes while nodes kept joining. The lane also waits
/// while nodes are being initialised, up to [`FINISHING_WAITS_AT_MOST`]
/// after each node's taint came off: written beside the taints, the
/// events of a 1,000-node join took the API server's time the taints of
/// the same join were waiting for. Bounded: past [`FINISHING_QUEUED`]
/// nodes the workers wait for room.
pub struct Finishing {
    tx: tokio::sync::mpsc::Sender<Initialised>,
    rx: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Initialised>>,
    /// Initialising syncs in flight.
    initialising: tokio::sync::watch::Sender<usize>,
}

impl Default for Finishing {
    fn default() -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(FINISHING_QUEUED);
        Self {
            tx,
            rx: tokio::sync::Mutex::new(rx),
            initialising: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// An initialising sync in flight, counted until dropped.
pub struct InitialisingNow<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for InitialisingNow<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Finishing {
    /// Queues `done`, waiting for room.
    pub async fn send(&self, done: Initialised) {
        // The receiver lives as long as the lane.
        let _ = self.tx.send(done).await;
    }

    /// The receiving end, for one writer at a time.
    pub async fn receiver(
        &self,
    ) -> tokio::sync::MutexGuard<'_, tokio::sync::mpsc::Receiver<Initialised>> {
        self.rx.lock().await
    }

    /// Counts an initialising sync until the guard is dropped.
    pub fn initialising(&self) -> InitialisingNow<'_> {
        self.initialising.send_modify(|n| *n += 1);
        InitialisingNow(&self.initialising)
    }

    /// Waits until no node is being initialised, or until
    /// [`FINISHING_WAITS_AT_MOST`] after `at`, whichever comes first.
    pub async fn behind_initialisations(&self, at: tokio::time::Instant) {
        let mut rx = self.initialising.subscribe();
        let _ =
            tokio::time::timeout_at(at + FINISHING_WAITS_AT_MOST, rx.wait_for(|n| *n == 0)).await;
    }
}

/// Node deletions the mass-deletion safeguard held back.
#[derive(Clone, Debug)]
pub struct HeldBack {
    /// The Nodes whose instances look gone.
    pub nodes: Vec<String>,
    /// Of how many Nodes.
    pub total: usize,
    /// When the pass held them back.
    pub at: std::time::SystemTime,
}

impl Context {
    /// Fails unless this replica leads now. Every write checks it first.
    pub fn ensure_leader(&self) -> Result<()> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Notes what the last lifecycle pass held back (`None`: nothing).
    pub fn hold_back(&self, held: Option<HeldBack>) {
        *self.held_back.lock().unwrap_or_else(|e| e.into_inner()) = held;
    }

    /// What `/debug/status` tells of this controller beyond what every
    /// controller tells: the deletions held back, the optional parts on.
    pub fn inspect(&self) -> serde_json::Value {
        use ccm_runtime::inspect::{MAX_LISTED, ago_s, rfc3339};
        let held = self.held_back.lock().unwrap_or_else(|e| e.into_inner());
        let uninitialized = self
            .store
            .state()
            .iter()
            .filter(|n| crate::plan::is_uninitialized(n))
            .count();
        serde_json::json!({
            "nodes": self.store.state().len(),
            "uninitialized": uninitialized,
            "held_back_deletions": held.as_ref().map(|h| serde_json::json!({
                "nodes": h.nodes.iter().take(MAX_LISTED).collect::<Vec<_>>(),
                "count": h.nodes.len(),
                "of": h.total,
                "max_share": self.settings.deletion_max_share,
                "at": rfc3339(h.at),
                "ago_s": ago_s(h.at),
            })),
            "tagging": self.tagging.is_some(),
            "approves_serving_csrs": self.csrs.is_some(),
        })
    }

    /// What `/debug/object` tells of one Node beyond its queue state.
    pub fn inspect_node(&self, name: &str) -> serde_json::Value {
        let node = self.store.get(name);
        let held = self.held_back.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::json!({
            "known": node.is_some(),
            "uninitialized": node.as_ref().is_some_and(|n| crate::plan::is_uninitialized(n)),
            "deletion_held_back": held.as_ref().is_some_and(|h| h.nodes.iter().any(|n| n == name)),
        })
    }

    /// Looks up instances through the gateway, counting the call;
    /// `drained` tells it that nothing more waits behind `nodes`, so that
    /// it need not wait for more.
    pub async fn lookup(
        &self,
        nodes: Vec<NodeRef>,
        purpose: LookupPurpose,
        fresh: bool,
        drained: bool,
    ) -> Result<Vec<InstanceResult>, ccm_proto::Error> {
        let result = self
            .gateway
            .get_instances_drained(nodes, purpose, fresh, drained)
            .await;
        self.metrics
            .gateway_calls
            .get_or_create(&GatewayLabels {
                operation: "get_instances",
                outcome: match &result {
                    Ok(_) => "ok",
                    Err(e) => e.metric_label(),
                },
            })
            .inc();
        result
    }
}
