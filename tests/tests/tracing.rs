//! Traces across the processes: with `--otlp-endpoint`, one Service's
//! load balancer ensure is one trace from the service controller's
//! reconcile, through its gateway call, into the gateway (auth, budget
//! wait, the provider call), received by an OTLP collector; and a batch of
//! instance lookups links the lookups that rode in it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_sandbox::{Options, Sandbox};
use ccm_testkit::otlp::{ReceivedSpan, Receiver};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

fn find(spans: &[ReceivedSpan], what: impl Fn(&ReceivedSpan) -> bool) -> Option<&ReceivedSpan> {
    spans.iter().find(|s| what(s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_services_ensure_is_one_trace_across_the_controller_and_the_gateway() {
    let receiver = Receiver::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let traced = vec!["--otlp-endpoint".to_owned(), receiver.endpoint.clone()];
    let sandbox = Sandbox::start(Options {
        nodes: 2,
        extra_args: BTreeMap::from([
            ("cloud-gateway".to_owned(), traced.clone()),
            ("service-controller".to_owned(), traced.clone()),
            ("node-controller".to_owned(), traced),
        ]),
        ..Options::new(dir.path().join("state"), ccm_testkit::bin_dir())
    })
    .await
    .unwrap();
    sandbox.populate().await.unwrap();
    let services: Api<Service> = Api::namespaced(sandbox.client().await.unwrap(), "default");
    services
        .create(
            &PostParams::default(),
            &kube_test_apiserver::fixtures::load_balancer("default", "traced").build(),
        )
        .await
        .unwrap();

    // Spans leave each process in batches (every 5 s by default).
    let start = Instant::now();
    let (sync, call, served, provider) = loop {
        let spans = receiver.spans();
        let sync = find(&spans, |s| {
            s.service == "service-controller"
                && s.name == "sync_service"
                && s.attribute("service") == Some("default/traced")
        });
        let call = sync.and_then(|sync| {
            find(&spans, |s| {
                s.trace_id == sync.trace_id && s.name == "cloudgateway.v1/EnsureLoadBalancer"
            })
        });
        let served = call.and_then(|call| {
            find(&spans, |s| {
                s.service == "cloud-gateway" && s.parent_span_id == call.span_id
            })
        });
        let provider = served.and_then(|served| {
            find(&spans, |s| {
                s.service == "cloud-gateway"
                    && s.trace_id == served.trace_id
                    && s.name == "provider call"
                    && s.attribute("operation") == Some("ensure_load_balancer")
            })
        });
        if let (Some(sync), Some(call), Some(served), Some(provider)) =
            (sync, call, served, provider)
        {
            break (sync.clone(), call.clone(), served.clone(), provider.clone());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no complete trace of the ensure; spans received: {:#?}",
            spans
                .iter()
                .map(|s| (&s.service, &s.name, s.attributes.len()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    sandbox.stop().await;

    // One trace: the reconcile, its call, the gateway's handling of that
    // call (a child of the call, in another process) and the cloud call.
    assert_eq!(
        call.parent_span_id, sync.span_id,
        "the call is the reconcile's child"
    );
    assert_eq!(served.trace_id, sync.trace_id);
    assert_eq!(
        served.name, "cloudgateway.v1.LoadBalancers/EnsureLoadBalancer",
        "{served:?}"
    );
    assert_eq!(
        served.attribute("rpc.grpc.status_code"),
        Some("0"),
        "{served:?}"
    );
    assert_eq!(provider.trace_id, sync.trace_id);
    let spans = receiver.spans();
    let in_trace: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == sync.trace_id)
        .collect();
    // The gateway's steps on the way: who called, and the budget wait with
    // its priority.
    let auth = in_trace
        .iter()
        .find(|s| s.name == "auth")
        .expect("an auth span in the trace");
    assert_eq!(auth.attribute("role"), Some("service"), "{auth:?}");
    let budget = in_trace
        .iter()
        .find(|s| s.name == "budget wait")
        .expect("a budget span in the trace");
    assert!(
        budget.attribute("priority").is_some() && budget.attribute("waited_ms").is_some(),
        "{budget:?}"
    );

    // The nodes' initialisation: each lookup is in its node's trace, and
    // the batch that served it (its own trace) links it.
    let lookups: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.service == "cloud-gateway" && s.name == "instance lookup")
        .collect();
    assert!(!lookups.is_empty(), "no instance lookup spans");
    let batch = spans
        .iter()
        .find(|s| {
            s.name == "instance batch"
                && s.links
                    .iter()
                    .any(|l| lookups.iter().any(|x| &x.span_id == l))
        })
        .expect("an instance batch linking a lookup");
    assert!(
        batch.parent_span_id.is_empty(),
        "a batch is a root of its own: {batch:?}"
    );
}
