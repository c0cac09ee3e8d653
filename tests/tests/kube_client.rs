//! kube-rs, the client our controllers use, against the test API server:
//! watchers and reflectors, 410 Gone recovery, optimistic concurrency,
//! status subresources, selectors, pagination, finalizers, server-side
//! apply, events and TokenReview.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Service};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_test_apiserver::{ApiServer, TokenUser};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

async fn timed<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, f).await.expect("timed out")
}

fn node(name: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": "10.244.0.0/24"},
    }))
    .unwrap()
}

async fn setup() -> (ApiServer, Api<Node>) {
    let server = ApiServer::start().await.unwrap();
    let nodes = Api::all(server.client().await.unwrap());
    (server, nodes)
}

/// Waits until the reflector's store holds exactly `names`.
async fn store_holds(reader: &reflector::Store<Node>, names: &[&str]) {
    let want: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
    timed(async {
        loop {
            let have: BTreeSet<String> = reader.state().iter().map(|n| n.name_any()).collect();
            if have == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_reflector_sees_adds_updates_and_deletes() {
    let (_server, nodes) = setup().await;
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", json!({}))).await.unwrap();
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(nodes.clone(), watcher::Config::default()))
        .applied_objects()
        .boxed();
    let task = tokio::spawn(stream.try_for_each(|_| async { Ok(()) }));
    store_holds(&reader, &["n1"]).await;

    nodes.create(&pp, &node("n2", json!({}))).await.unwrap();
    store_holds(&reader, &["n1", "n2"]).await;
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    timed(async {
        while reader
            .get(&reflector::ObjectRef::new("n2"))
            .and_then(|n| n.labels().get("x").cloned())
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    store_holds(&reader, &["n2"]).await;
    task.abort();
}

#[tokio::test]
async fn a_watcher_recovers_from_410_gone_by_listing_again() {
    let (server, nodes) = setup().await;
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", json!({}))).await.unwrap();
    let (reader, writer) = reflector::store();
    let inits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = inits.clone();
    let stream = reflector(
        writer,
        watcher(nodes.clone(), watcher::Config::default()).default_backoff(),
    )
    .inspect_ok(move |event| {
        if matches!(event, watcher::Event::Init) {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .boxed();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store_holds(&reader, &["n1"]).await;

    // Changes the node watch never sees move the resource version on;
    // then the history is compacted and the connection drops. Resuming from
    // the watcher's last version must fail with 410, and it must list again.
    let services: Api<Service> = Api::namespaced(server.client().await.unwrap(), "default");
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .unwrap();
    services.create(&pp, &svc).await.unwrap();
    server.store().compact();
    server.disconnect_watches();
    timed(async {
        while inits.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // And it keeps watching afterwards.
    nodes.create(&pp, &node("n2", json!({}))).await.unwrap();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    store_holds(&reader, &["n2"]).await;
    task.abort();
}

#[tokio::test]
async fn watching_from_a_compacted_version_answers_410_expired() {
    let (server, nodes) = setup().await;
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let old = nodes.get("n1").await.unwrap().resource_version().unwrap();
    nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    server.store().compact();
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(5), &old)
        .await
        .unwrap()
        .boxed();
    match timed(stream.next()).await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn watches_resume_from_a_resource_version_and_send_bookmarks() {
    let server = ApiServer::start_with(kube_test_apiserver::Config {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let created = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    let from = created.resource_version().unwrap();
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .unwrap()
        .boxed();
    let mut added = Vec::new();
    let mut bookmark = false;
    while !bookmark || added.is_empty() {
        match timed(stream.next()).await.unwrap().unwrap() {
            WatchEvent::Added(n) => added.push(n.name_any()),
            WatchEvent::Bookmark(_) => bookmark = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, ["n2"], "only what came after the resource version");
}

#[tokio::test]
async fn stale_updates_conflict_and_duplicates_already_exist() {
    let (_server, nodes) = setup().await;
    let pp = PostParams::default();
    let created = nodes.create(&pp, &node("n1", json!({}))).await.unwrap();
    let err = nodes.create(&pp, &node("n1", json!({}))).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    let mut first = created.clone();
    first.labels_mut().insert("a".into(), "1".into());
    let updated = nodes.replace("n1", &pp, &first).await.unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());

    let mut stale = created.clone();
    stale.labels_mut().insert("b".into(), "2".into());
    let err = nodes.replace("n1", &pp, &stale).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );

    // A no-op write leaves the resource version alone.
    let again = nodes.replace("n1", &pp, &updated).await.unwrap();
    assert_eq!(again.resource_version(), updated.resource_version());
}

#[tokio::test]
async fn the_status_subresource_writes_only_status() {
    let (_server, nodes) = setup().await;
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let status = json!({
        "metadata": {"labels": {"sneaky": "yes"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let patched = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    assert!(
        patched.labels().get("sneaky").is_none(),
        "labels cannot change through status"
    );
    assert_eq!(
        patched
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()[0]
            .type_,
        "Ready"
    );

    let mut main = patched.clone();
    main.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    main.labels_mut().insert("visible".into(), "yes".into());
    let replaced = nodes
        .replace("n1", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        replaced.labels().get("visible").map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        replaced.status.unwrap().conditions.unwrap()[0].status,
        "True",
        "status cannot change through the main resource"
    );
}

#[tokio::test]
async fn lists_filter_by_label_and_field_and_page_with_continue() {
    let (server, nodes) = setup().await;
    let pp = PostParams::default();
    for i in 0..5 {
        let role = if i % 2 == 0 { "even" } else { "odd" };
        nodes
            .create(&pp, &node(&format!("n{i}"), json!({"role": role})))
            .await
            .unwrap();
    }
    let even = nodes
        .list(&ListParams::default().labels("role=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 3);
    let one = nodes
        .list(&ListParams::default().fields("metadata.name=n3"))
        .await
        .unwrap();
    assert_eq!(
        one.items.iter().map(|n| n.name_any()).collect::<Vec<_>>(),
        ["n3"]
    );
    let set = nodes
        .list(&ListParams::default().labels("role in (odd),!missing"))
        .await
        .unwrap();
    assert_eq!(set.items.len(), 2);

    let mut names = Vec::new();
    let mut params = ListParams::default().limit(2);
    loop {
        let page = nodes.list(&params).await.unwrap();
        assert!(page.items.len() <= 2);
        names.extend(page.items.iter().map(|n| n.name_any()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4"]);

    let services: Api<Service> = Api::namespaced(server.client().await.unwrap(), "default");
    for (name, kind) in [("a", "LoadBalancer"), ("b", "ClusterIP")] {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name}, "spec": {"type": kind, "ports": [{"port": 80}]}
        }))
        .unwrap();
        services.create(&pp, &svc).await.unwrap();
    }
    let lbs = services
        .list(&ListParams::default().fields("spec.type=LoadBalancer"))
        .await
        .unwrap();
    assert_eq!(
        lbs.items.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["a"]
    );
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_server, nodes) = setup().await;
    let mut n = node("n1", json!({}));
    n.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    nodes.create(&PostParams::default(), &n).await.unwrap();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    let held = nodes.get("n1").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let release = json!({"metadata": {"finalizers": null}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    assert!(nodes.get_opt("n1").await.unwrap().is_none());
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let (_server, nodes) = setup().await;
    let params = PatchParams::apply("test-manager");
    let first = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1"}}});
    let created = nodes
        .patch("n1", &params, &Patch::Apply(first))
        .await
        .unwrap();
    assert_eq!(created.labels().get("a").map(String::as_str), Some("1"));
    let second = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"b": "2"}}});
    let merged = nodes
        .patch("n1", &params, &Patch::Apply(second))
        .await
        .unwrap();
    assert_eq!(merged.labels().get("b").map(String::as_str), Some("2"));
}

#[tokio::test]
async fn strategic_merge_patches_merge_conditions_by_type() {
    let (_server, nodes) = setup().await;
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    for (kind, status) in [
        ("Ready", "True"),
        ("NetworkUnavailable", "True"),
        ("NetworkUnavailable", "False"),
    ] {
        let patch = json!({"status": {"conditions": [{"type": kind, "status": status}]}});
        nodes
            .patch_status("n1", &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }
    let conditions = nodes
        .get("n1")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap();
    let seen: Vec<(String, String)> = conditions
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        seen,
        [
            ("Ready".into(), "True".into()),
            ("NetworkUnavailable".into(), "False".into())
        ]
    );
}

#[tokio::test]
async fn the_event_recorder_publishes_and_updates_series() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (server, nodes) = setup().await;
    let n = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "node-controller".into(),
            instance: Some("pod-1".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("Node synced successfully".into()),
        action: "Sync".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&n, &());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.items.len(),
        1,
        "a repeated event is one object with a series"
    );
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("Synced"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    // The same event through core/v1, as kubectl reads it.
    let core: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(server.client().await.unwrap(), "default");
    let mirrored = core.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(mirrored.len(), 1);
    assert_eq!(
        mirrored[0].message.as_deref(),
        Some("Node synced successfully")
    );
    assert_eq!(mirrored[0].involved_object.name.as_deref(), Some("n1"));
    // As kube-apiserver converts an events.k8s.io event: its series and
    // event time are kept, and the deprecated count and timestamps, which
    // an events.k8s.io writer may not set, stay unset.
    assert_eq!(mirrored[0].series.as_ref().and_then(|s| s.count), Some(2));
    assert!(mirrored[0].event_time.is_some());
    assert_eq!(mirrored[0].count, None);
    assert_eq!(mirrored[0].last_timestamp, None);
}

#[tokio::test]
async fn token_reviews_authenticate_registered_tokens_for_their_audience() {
    let server = ApiServer::start().await.unwrap();
    server.register_token(
        "sa-token",
        TokenUser {
            username: "system:serviceaccount:kube-system:node-controller".into(),
            uid: "u-1".into(),
            groups: vec!["system:serviceaccounts".into()],
            audiences: vec!["cloud-gateway".into()],
        },
    );
    let reviews: Api<TokenReview> = Api::all(server.client().await.unwrap());
    let review = |token: &str, audience: &str| TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            audiences: Some(vec![audience.into()]),
        },
        ..Default::default()
    };
    let ok = reviews
        .create(&PostParams::default(), &review("sa-token", "cloud-gateway"))
        .await
        .unwrap();
    let status = ok.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:kube-system:node-controller")
    );
    for (token, audience) in [("sa-token", "someone-else"), ("forged", "cloud-gateway")] {
        let refused = reviews
            .create(&PostParams::default(), &review(token, audience))
            .await
            .unwrap();
        assert_eq!(
            refused.status.unwrap().authenticated,
            Some(false),
            "{token} for {audience}"
        );
    }
}
