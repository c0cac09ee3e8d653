//! `/debug/requests`: what each caller asked and how many bytes it was
//! sent, watch streams included; `DELETE` starts the count again.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube_test_apiserver::{ApiServer, fixtures};
use serde_json::{Value, json};

async fn report(server: &ApiServer, method: &str) -> Value {
    let request = http::Request::builder()
        .method(method)
        .uri("/debug/requests")
        .body(Vec::new())
        .unwrap();
    let text = server
        .client()
        .await
        .unwrap()
        .request_text(request)
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn each_callers_requests_and_bytes_are_counted_by_verb_and_resource() {
    use futures::StreamExt;
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    for name in ["a", "b", "c"] {
        nodes
            .create(&PostParams::default(), &fixtures::node(name).build())
            .await
            .unwrap();
    }
    // Two pages, then a status patch, then a watch that sees it.
    let first = nodes.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    nodes
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let stream = nodes.watch(&WatchParams::default(), &rv).await.unwrap();
    nodes
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let admin = &report(&server, "GET").await["admin"];
    let requests = &admin["requests"];
    assert_eq!(requests["create nodes"], 3, "{admin}");
    assert_eq!(requests["list nodes"], 2, "one a page: {admin}");
    assert_eq!(requests["patch nodes/status"], 1, "{admin}");
    assert_eq!(requests["watch nodes"], 1, "{admin}");
    let bytes = admin["bytes"].as_u64().unwrap();
    let largest = admin["largest_response_bytes"].as_u64().unwrap();
    assert!(largest > 100 && bytes > 3 * largest / 2, "{admin}");

    // Counting starts again; the open watch counts what it is sent next.
    report(&server, "DELETE").await;
    let again = &report(&server, "GET").await["admin"];
    assert_eq!(again["requests"], json!({}), "{again}");
    assert_eq!(again["bytes"], 0);
    nodes
        .patch_status(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after = &report(&server, "GET").await["admin"];
    assert_eq!(after["requests"], json!({"patch nodes/status": 1}));
    assert!(after["bytes"].as_u64().unwrap() > 0, "{after}");
}
