//! Access reviews under RBAC, through a kube client (kubectl sends no
//! credentials over plain http, so under RBAC it cannot be anyone here):
//! each review is answered from the policy in force, as kube-apiserver
//! answers it, and none counts as a refusal or a use of a grant in the
//! RBAC report.

use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview,
    SelfSubjectAccessReviewSpec, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use kube_test_apiserver::{ADMIN_TOKEN, ApiServer, TokenUser};
use serde_json::Value;

const POLICY: &str = r#"
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: node-reader}
rules:
  - {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
  - {nonResourceURLs: [/metrics], verbs: [get]}
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: node-readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-reader}
subjects: [{kind: User, name: operator}]
---
kind: Role
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: lease, namespace: kube-system}
rules:
  - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get]}
---
kind: RoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: lease, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: lease}
subjects: [{kind: ServiceAccount, name: ctl}]
"#;

fn client(server: &ApiServer, token: &str, impersonate: Option<&str>) -> kube::Client {
    let mut config = server.client_config(Some(token));
    config.auth_info.impersonate = impersonate.map(str::to_owned);
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn resource(verb: &str, group: &str, resource: &str, ns: Option<&str>) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(verb.into()),
        group: Some(group.into()),
        resource: Some(resource.into()),
        namespace: ns.map(Into::into),
        ..Default::default()
    }
}

async fn ask(
    client: &kube::Client,
    user: &str,
    groups: &[&str],
    attributes: ResourceAttributes,
) -> SubjectAccessReviewStatus {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: (!user.is_empty()).then(|| user.to_owned()),
            groups: (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect()),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
}

async fn ask_self(client: &kube::Client, attributes: ResourceAttributes) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

fn denied(report: &Value) -> Vec<String> {
    report["denied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{} {} {}",
                d["user"].as_str().unwrap(),
                d["verb"].as_str().unwrap(),
                d["resource"].as_str().unwrap()
            )
        })
        .collect()
}

fn unused(report: &Value) -> Vec<String> {
    report["unused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            format!(
                "{} {}",
                u["verb"].as_str().unwrap(),
                u["resource"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn access_reviews_answer_from_rbac_and_are_not_requests() {
    let server = ApiServer::start().await.unwrap();
    server.enforce_rbac(&kube_test_apiserver::documents(POLICY).unwrap());
    for user in ["operator", "stranger"] {
        server.register_token(
            format!("{user}-token"),
            TokenUser {
                username: user.into(),
                uid: user.into(),
                groups: vec![],
                audiences: vec![],
            },
        );
    }
    let admin = client(&server, ADMIN_TOKEN, None);
    let operator = client(&server, "operator-token", None);
    let stranger = client(&server, "stranger-token", None);

    // SubjectAccessReview, as the admin asks it for others.
    let status = ask(&admin, "operator", &[], resource("list", "", "nodes", None)).await;
    assert!(status.allowed);
    assert_eq!(
        status.reason.as_deref(),
        Some(
            r#"RBAC: allowed by ClusterRoleBinding "node-readers" of ClusterRole "node-reader" to User "operator""#
        )
    );
    let status = ask(&admin, "stranger", &[], resource("list", "", "nodes", None)).await;
    assert!(!status.allowed);
    assert_eq!(status.reason, None);
    assert!(
        !ask(
            &admin,
            "operator",
            &[],
            resource("delete", "", "nodes", None)
        )
        .await
        .allowed
    );
    // A RoleBinding grants in its namespace only; its ServiceAccount
    // subject is named with the binding's namespace.
    let ctl = "system:serviceaccount:kube-system:ctl";
    let lease = |ns| resource("get", "coordination.k8s.io", "leases", Some(ns));
    let status = ask(&admin, ctl, &[], lease("kube-system")).await;
    assert_eq!(
        status.reason.as_deref(),
        Some(
            r#"RBAC: allowed by RoleBinding "lease/kube-system" of Role "lease" to ServiceAccount "ctl/kube-system""#
        )
    );
    assert!(!ask(&admin, ctl, &[], lease("default")).await.allowed);
    // Masters may do anything, with no reason given.
    let status = ask(
        &admin,
        "",
        &["system:masters"],
        resource("delete", "", "nodes", None),
    )
    .await;
    assert!(status.allowed && status.reason.is_none());
    // Non-resource URLs: the chart's rule, and the bootstrap policy's
    // discovery for every authenticated user.
    let path = |user: &str, groups: &[&str], path: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let sars = Api::<SubjectAccessReview>::all(admin.clone());
    for (user, groups, url, allowed) in [
        ("operator", &[][..], "/metrics", true),
        ("stranger", &[], "/metrics", false),
        (
            "stranger",
            &["system:authenticated"],
            "/apis/coordination.k8s.io",
            true,
        ),
        ("stranger", &[], "/apis", false),
        ("stranger", &[], "/healthz", true),
    ] {
        let status = sars
            .create(&PostParams::default(), &path(user, groups, url))
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(status.allowed, allowed, "{user} {groups:?} {url}");
    }
    // A review names a user or groups.
    let err = sars
        .create(&PostParams::default(), &SubjectAccessReview::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422),
        "{err}"
    );

    // SelfSubjectAccessReview: anyone authenticated may ask about
    // themselves (the bootstrap policy's system:basic-user).
    assert!(ask_self(&operator, resource("list", "", "nodes", None)).await);
    assert!(!ask_self(&operator, resource("delete", "", "nodes", None)).await);
    assert!(!ask_self(&stranger, resource("list", "", "nodes", None)).await);
    // Through impersonation, as `kubectl auth can-i --as` asks.
    let as_stranger = client(&server, ADMIN_TOKEN, Some("stranger"));
    assert!(!ask_self(&as_stranger, resource("list", "", "nodes", None)).await);
    let as_operator = client(&server, ADMIN_TOKEN, Some("operator"));
    assert!(ask_self(&as_operator, resource("get", "", "nodes", None)).await);

    // LocalSubjectAccessReview, in its namespace.
    let local = LocalSubjectAccessReview {
        metadata: Default::default(),
        spec: SubjectAccessReviewSpec {
            user: Some(ctl.into()),
            resource_attributes: Some(lease("kube-system")),
            ..Default::default()
        },
        status: None,
    };
    let locals = Api::<LocalSubjectAccessReview>::namespaced(admin.clone(), "kube-system");
    let answer = locals.create(&PostParams::default(), &local).await.unwrap();
    assert!(answer.status.unwrap().allowed);
    let elsewhere = Api::<LocalSubjectAccessReview>::namespaced(admin.clone(), "default");
    let err = elsewhere
        .create(&PostParams::default(), &local)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("must match metadata.namespace"),
        "{err}"
    );

    // SelfSubjectRulesReview: the operator's rules, the bootstrap
    // policy's among them.
    let rules = Api::<SelfSubjectRulesReview>::all(operator.clone())
        .create(
            &PostParams::default(),
            &SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some("default".into()),
                },
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .status
        .unwrap();
    let resources: Vec<String> = rules
        .resource_rules
        .iter()
        .flat_map(|r| r.resources.clone().unwrap_or_default())
        .collect();
    assert!(
        resources.contains(&"nodes".to_owned())
            && resources.contains(&"selfsubjectaccessreviews".to_owned()),
        "{resources:?}"
    );
    assert!(
        !resources.contains(&"leases".to_owned()),
        "the lease Role is kube-system's"
    );
    assert!(!rules.incomplete);

    // None of that was a request: nothing refused, no grant used. A
    // stranger creating a SubjectAccessReview is a request, and refused.
    let report = server.rbac_report().unwrap();
    assert_eq!(denied(&report), Vec::<String>::new());
    assert!(
        unused(&report).contains(&"list nodes".to_owned()),
        "{report}"
    );
    let err = ask_err(&stranger).await;
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
    Api::<Node>::all(operator.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let report = server.rbac_report().unwrap();
    assert_eq!(denied(&report), ["stranger create subjectaccessreviews"]);
    assert!(
        !unused(&report).contains(&"list nodes".to_owned()),
        "{report}"
    );
}

async fn ask_err(client: &kube::Client) -> kube::Error {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("operator".into()),
            resource_attributes: Some(resource("list", "", "nodes", None)),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn without_rbac_everyone_may_do_anything() {
    let server = ApiServer::start().await.unwrap();
    let admin = client(&server, ADMIN_TOKEN, None);
    let status = ask(
        &admin,
        "stranger",
        &[],
        resource("delete", "", "nodes", None),
    )
    .await;
    assert!(status.allowed);
    let as_stranger = client(&server, ADMIN_TOKEN, Some("stranger"));
    assert!(ask_self(&as_stranger, resource("delete", "", "nodes", None)).await);
    let rules = Api::<SelfSubjectRulesReview>::all(admin)
        .create(&PostParams::default(), &SelfSubjectRulesReview::default())
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        rules.resource_rules[0].resources.as_deref(),
        Some(&["*".to_owned()][..])
    );
}

/// Even with RBAC off, where everyone else may do anything, a caller with
/// no credential is handed none: no token for a ServiceAccount, and no one
/// to act as.
#[tokio::test]
async fn without_rbac_an_anonymous_caller_gets_no_token_and_acts_as_no_one() {
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let server = ApiServer::start().await.unwrap();
        let admin = client(&server, ADMIN_TOKEN, None);
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(admin.clone(), "default");
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": "robot"}}))
                    .unwrap(),
            )
            .await
            .unwrap();
        let token_request = |client: kube::Client| async move {
            let request = http::Request::post(
                "/api/v1/namespaces/default/serviceaccounts/robot/token",
            )
            .header("content-type", "application/json")
            .body(
                br#"{"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","spec":{}}"#
                    .to_vec(),
            )
            .unwrap();
            client.request::<Value>(request).await
        };
        let mut config = server.client_config(None);
        config.default_retry = false;
        let anonymous = kube::Client::try_from(config.clone()).unwrap();
        let refused = token_request(anonymous.clone()).await.unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(e) if e.code == 401),
            "{refused:?}"
        );
        let minted = token_request(admin.clone()).await.unwrap();
        assert!(minted["status"]["token"].as_str().is_some(), "{minted}");

        config.auth_info.impersonate = Some("system:admin".into());
        let posing = kube::Client::try_from(config).unwrap();
        let refused = Api::<Node>::all(posing)
            .list(&ListParams::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(e) if e.code == 401),
            "{refused:?}"
        );
        // Anonymous without impersonating: as before, anything goes.
        Api::<Node>::all(anonymous)
            .list(&ListParams::default())
            .await
            .unwrap();
        let as_someone = client(&server, ADMIN_TOKEN, Some("someone"));
        Api::<Node>::all(as_someone)
            .list(&ListParams::default())
            .await
            .unwrap();
    })
    .await
    .expect("within 30 s");
}
