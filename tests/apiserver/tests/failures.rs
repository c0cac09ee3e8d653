//! The test server's own failures, as tests and the chaos soak make them:
//! its state kept across a restart, a new resourceVersion epoch, watches
//! expired and updates refused on request; a malformed request for a
//! fault is refused whole.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube_test_apiserver::{ApiServer, Config, fixtures};

async fn on_disk(dir: &std::path::Path) -> ApiServer {
    ApiServer::start_with(Config {
        state_dir: Some(dir.to_path_buf()),
        ..Config::default()
    })
    .await
    .unwrap()
}

/// POSTs `body` to the server's `path` as the admin.
async fn post(
    server: &ApiServer,
    path: &str,
    body: serde_json::Value,
) -> Result<String, kube::Error> {
    let request = http::Request::post(path)
        .body(body.to_string().into_bytes())
        .unwrap();
    server.client().await.unwrap().request_text(request).await
}

async fn fault(server: &ApiServer, body: serde_json::Value) -> Result<String, kube::Error> {
    post(server, "/debug/faults", body).await
}

/// The first event of a watch from `rv`.
async fn first_event(nodes: &Api<Node>, rv: &str) -> WatchEvent<Node> {
    use futures::StreamExt;
    let stream = nodes.watch(&WatchParams::default(), rv).await.unwrap();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_server_started_again_on_its_state_has_every_object_and_expires_old_watches() {
    let dir = tempfile::tempdir().unwrap();
    let server = on_disk(dir.path()).await;
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes
        .create(&PostParams::default(), &fixtures::node("a").build())
        .await
        .unwrap();
    let b = nodes
        .create(&PostParams::default(), &fixtures::node("b").build())
        .await
        .unwrap();
    nodes
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    nodes.delete("b", &Default::default()).await.unwrap();
    let seen = b.metadata.resource_version.unwrap();
    drop(server);

    let server = on_disk(dir.path()).await;
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let listed = nodes.list(&Default::default()).await.unwrap();
    let names: Vec<_> = listed
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(names, ["a"]);
    assert_eq!(
        listed.items[0].metadata.labels.as_ref().unwrap()["x"],
        "y",
        "the last write of it"
    );
    assert!(
        listed
            .metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > seen.parse::<u64>().unwrap()
    );
    match first_event(&nodes, &seen).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("a watch from before the restart must list again: {other:?}"),
    }
    // The namespaces a new cluster has are not made twice.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
        Api::all(server.client().await.unwrap());
    assert_eq!(
        namespaces
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        4
    );
}

#[tokio::test]
async fn a_new_epoch_moves_versions_on_and_expires_every_watch() {
    let dir = tempfile::tempdir().unwrap();
    let server = on_disk(dir.path()).await;
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let a = nodes
        .create(&PostParams::default(), &fixtures::node("a").build())
        .await
        .unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    server.store().bump_resource_version(1_000_000);
    match first_event(&nodes, &rv).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
    // Objects keep their versions: an update against one still works.
    let mut a = nodes.get("a").await.unwrap();
    assert_eq!(a.metadata.resource_version.as_deref(), Some(rv.as_str()));
    a.metadata.labels = Some([("k".to_owned(), "v".to_owned())].into());
    let updated = nodes
        .replace("a", &PostParams::default(), &a)
        .await
        .unwrap();
    let new: u64 = updated.metadata.resource_version.unwrap().parse().unwrap();
    assert!(new > 1_000_000);
    // The bump outlives a restart.
    drop(server);
    let server = on_disk(dir.path()).await;
    let listed = Api::<Node>::all(server.client().await.unwrap())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        listed
            .metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= new
    );
}

#[tokio::test]
async fn faults_expire_watches_and_refuse_updates_for_a_while() {
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let a = nodes
        .create(&PostParams::default(), &fixtures::node("a").build())
        .await
        .unwrap();
    fault(&server, serde_json::json!({"expireWatches": true}))
        .await
        .unwrap();
    match first_event(&nodes, a.metadata.resource_version.as_deref().unwrap()).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }

    fault(
        &server,
        serde_json::json!({"refuseUpdates": {"resource": "nodes", "subresource": "status", "seconds": 1}}),
    )
    .await
    .unwrap();
    let label = Patch::Merge(serde_json::json!({"metadata": {"labels": {"k": "v"}}}));
    nodes
        .patch("a", &PatchParams::default(), &label)
        .await
        .expect("only the status is refused");
    let status = Patch::Merge(serde_json::json!({"status": {"phase": "Running"}}));
    match nodes
        .patch_status("a", &PatchParams::default(), &status)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    nodes
        .patch_status("a", &PatchParams::default(), &status)
        .await
        .expect("taken again once the time is up");

    for bad in [
        serde_json::json!({"expireWatches": "yes"}),
        serde_json::json!({"refuseUpdates": {"resource": "widgets", "seconds": 1}}),
        serde_json::json!({"refuseUpdates": {"resource": "nodes", "seconds": -1}}),
        serde_json::json!({"refuseUpdates": {"resource": "nodes", "seconds": 1, "subresource": "scale"}}),
    ] {
        match fault(&server, bad.clone()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 400, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_paged_list_keeps_its_first_version_and_an_old_one_is_gone() {
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    // Many at once, as kubelets registering together, with their status.
    let items: Vec<serde_json::Value> = (0..1200)
        .map(|i| {
            fixtures::kubelet_node(
                &format!("n{i:04}"),
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                None,
                true,
            )
        })
        .collect();
    for chunk in items.chunks(100) {
        let answer = post(
            &server,
            "/debug/objects",
            serde_json::json!({"items": chunk}),
        )
        .await
        .unwrap();
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["created"], 100, "{answer}");
    }
    let first = nodes
        .list(&kube::api::ListParams::default().limit(500))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 500);
    let rv = first.metadata.resource_version.clone().unwrap();
    let status = first.items[0].status.as_ref().unwrap();
    assert_eq!(
        status.images.as_ref().map(Vec::len),
        Some(40),
        "created with its status"
    );
    // A change between pages: later pages keep the first page's version,
    // so a watch from it replays the change.
    nodes
        .patch(
            "n0000",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"changed": "yes"}}})),
        )
        .await
        .unwrap();
    let mut token = first.metadata.continue_.clone();
    let mut names: Vec<String> = first
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = nodes
            .list(
                &kube::api::ListParams::default()
                    .limit(500)
                    .continue_token(&t),
            )
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
        names.extend(page.items.iter().filter_map(|n| n.metadata.name.clone()));
        token = page.metadata.continue_;
    }
    assert_eq!(names.len(), 1200);
    assert!(names.windows(2).all(|w| w[0] < w[1]), "in order, each once");
    match first_event(&nodes, &rv).await {
        WatchEvent::Modified(n) => assert_eq!(n.metadata.name.as_deref(), Some("n0000")),
        other => panic!("the change is replayed: {other:?}"),
    }
    // Once the history is gone, so is the list.
    server.store().compact();
    let t = first.metadata.continue_.unwrap();
    match nodes
        .list(
            &kube::api::ListParams::default()
                .limit(500)
                .continue_token(&t),
        )
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
}
