//! The request meter: how many API requests one provider call sent, so
//! the gateway's budget counts requests, not calls.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static API_REQUESTS: Cell<u32>;
}

/// Counts one request a provider sent to its cloud's API. A provider whose
/// calls may take several requests calls it once per request (the AWS
/// provider from an SDK interceptor), so the budget is charged for each.
pub fn count_api_request() {
    let _ = API_REQUESTS.try_with(|n| n.set(n.get().saturating_add(1)));
}

/// Runs one provider call and returns its output with the number of API
/// requests it sent: at least one, for providers that do not count.
pub async fn metered<T>(call: impl Future<Output = T>) -> (T, u32) {
    API_REQUESTS
        .scope(Cell::new(0), async {
            let out = call.await;
            (out, API_REQUESTS.with(Cell::get).max(1))
        })
        .await
}
