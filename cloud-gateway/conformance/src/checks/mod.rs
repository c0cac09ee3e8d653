//! The checks by area of the contract, each an `async fn` named after its
//! check: `lb.update-hosts` is `load_balancers::update_hosts`. The crate
//! root lists them in the order they run, with the rule each tests and the
//! capability each needs.

pub(crate) mod auth;
pub(crate) mod fixtures;
pub(crate) mod health;
pub(crate) mod instances;
pub(crate) mod load_balancers;
pub(crate) mod node_groups;
pub(crate) mod provider;
pub(crate) mod request;
pub(crate) mod routes;
pub(crate) mod volumes;
