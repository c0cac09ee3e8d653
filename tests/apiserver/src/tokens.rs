//! ServiceAccount tokens the server mints, as kube-apiserver's TokenRequest
//! API does (`kubectl create token`): a JWT naming the ServiceAccount (and
//! the object it is bound to, if any), its audiences and its expiry, signed
//! with the cluster's signing key (see `pki`), so a server started again on
//! the same state directory still accepts it.
//!
//! A token authenticates while it is unexpired and the ServiceAccount, and
//! the Pod or Node it is bound to, still exist with the uids it
//! names: deleting any of them revokes it, as on a real cluster.
//!
//! Signed with HMAC-SHA256 rather than kube-apiserver's RS256: only this
//! server verifies them; nothing publishes a JWKS.

use serde_json::{Value, json};

use crate::store::{ApiError, Store, timestamp, unix_now};
use crate::{DEFAULT_AUDIENCE, TokenUser, resources};

/// The token lifetime when a request names none, as kube-apiserver's.
const DEFAULT_EXPIRATION_SECONDS: u64 = 3600;
/// The shortest lifetime a request may ask for, as kube-apiserver's.
const MIN_EXPIRATION_SECONDS: u64 = 600;
/// The longest lifetime a request may ask for, as kube-apiserver's.
const MAX_EXPIRATION_SECONDS: u64 = 1 << 32;
/// The issuer (`iss`) of every token, kube-apiserver's default.
const ISSUER: &str = DEFAULT_AUDIENCE;
/// The kinds a token may be bound to, each with its plural (kube-apiserver
/// binds to Secrets too; this server serves none).
const BINDABLE: [(&str, &str); 2] = [("Pod", "pods"), ("Node", "nodes")];

/// Answers a TokenRequest for the ServiceAccount `namespace/name`
/// (`POST .../serviceaccounts/NAME/token`): the request with its defaults
/// filled in and `status.token`, `status.expirationTimestamp` set.
pub(crate) fn request(
    store: &Store,
    key: &[u8],
    namespace: &str,
    name: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    let accounts = resource("serviceaccounts");
    let invalid = |message: String| ApiError::invalid(accounts, name, message);
    if body["kind"] != "TokenRequest" && !body["kind"].is_null() {
        return Err(ApiError::bad_request(format!(
            "the body of a token request is a TokenRequest, not a {}",
            body["kind"]
        )));
    }
    let account = store.get(accounts, namespace, name)?;
    let spec = &body["spec"];
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        None => vec![DEFAULT_AUDIENCE.to_owned()],
        Some(list) if list.is_empty() => vec![DEFAULT_AUDIENCE.to_owned()],
        Some(list) => list
            .iter()
            .map(|a| match a.as_str() {
                Some(a) if !a.is_empty() => Ok(a.to_owned()),
                _ => Err(invalid(format!(
                    "spec.audiences: Invalid value: {a}: must be a non-empty string"
                ))),
            })
            .collect::<Result<_, _>>()?,
    };
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => v.as_u64().ok_or_else(|| {
            invalid(format!(
                "spec.expirationSeconds: Invalid value: {v}: must be a whole number of seconds"
            ))
        })?,
    };
    if seconds < MIN_EXPIRATION_SECONDS {
        return Err(invalid(format!(
            "spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 10 minutes"
        )));
    }
    if seconds > MAX_EXPIRATION_SECONDS {
        return Err(invalid(format!(
            "spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
        )));
    }
    let bound = bound_object(store, namespace, &spec["boundObjectRef"]).map_err(invalid)?;
    let now = unix_now();
    let expires = now + seconds;
    let mut kubernetes = json!({
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]},
    });
    if let Some((kind, bound_name, uid)) = &bound {
        kubernetes[kind.to_lowercase()] = json!({"name": bound_name, "uid": uid});
    }
    let claims = json!({
        "aud": audiences,
        "exp": expires,
        "iat": now,
        "nbf": now,
        "iss": ISSUER,
        "jti": uuid::Uuid::new_v4().to_string(),
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "kubernetes.io": kubernetes,
    });
    body["apiVersion"] = json!("authentication.k8s.io/v1");
    body["kind"] = json!("TokenRequest");
    body["metadata"] = json!({
        "name": name,
        "namespace": namespace,
        "creationTimestamp": timestamp(now),
    });
    body["spec"] = json!({
        "audiences": audiences,
        "expirationSeconds": seconds,
        "boundObjectRef": bound.map(|(kind, name, uid)| json!({"kind": kind, "apiVersion": "v1", "name": name, "uid": uid})),
    });
    body["status"] = json!({
        "token": sign(key, &claims),
        "expirationTimestamp": timestamp(expires),
    });
    Ok(body)
}

/// The object a token request binds its token to, if it names one: its
/// kind, name and uid, after checking it exists (with the uid named, if
/// one is).
fn bound_object(
    store: &Store,
    namespace: &str,
    reference: &Value,
) -> Result<Option<(String, String, String)>, String> {
    if reference.is_null() {
        return Ok(None);
    }
    let kind = reference["kind"].as_str().unwrap_or_default();
    let Some((_, plural)) = BINDABLE.iter().find(|(k, _)| *k == kind) else {
        return Err(format!(
            "spec.boundObjectRef.kind: Unsupported value: {kind:?}: supported values: \"Pod\", \"Node\""
        ));
    };
    let name = reference["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        return Err("spec.boundObjectRef.name: Required value".into());
    }
    let r = resource(plural);
    let object = store
        .get(r, if r.namespaced { namespace } else { "" }, name)
        .map_err(|e| e.message)?;
    let uid = object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    match reference["uid"].as_str() {
        Some(wanted) if !wanted.is_empty() && wanted != uid => Err(format!(
            "the UID in the bound object reference ({wanted}) does not match the UID in record ({uid}); the object might have been deleted and then recreated"
        )),
        _ => Ok(Some((kind.to_owned(), name.to_owned(), uid))),
    }
}

/// The user a token minted here stands for, if its signature holds, it
/// has not expired and what it names still exists; `None` for anything
/// else, a token of another kind included.
pub(crate) fn verify(store: &Store, key: &[u8], token: &str) -> Option<TokenUser> {
    let claims = signed_claims(key, token)?;
    if claims["exp"].as_u64()? <= unix_now() || claims["iss"] != ISSUER {
        return None;
    }
    let k8s = &claims["kubernetes.io"];
    let namespace = k8s["namespace"].as_str()?;
    let account = &k8s["serviceaccount"];
    let name = account["name"].as_str()?;
    let still = |plural: &str, namespace: &str, name: &str, uid: &Value| {
        store
            .get(resource(plural), namespace, name)
            .is_ok_and(|o| o["metadata"]["uid"] == *uid)
    };
    if !still("serviceaccounts", namespace, name, &account["uid"]) {
        return None;
    }
    for (kind, plural) in BINDABLE {
        let bound = &k8s[kind.to_lowercase()];
        if bound.is_null() {
            continue;
        }
        let scope = if resource(plural).namespaced {
            namespace
        } else {
            ""
        };
        if !still(plural, scope, bound["name"].as_str()?, &bound["uid"]) {
            return None;
        }
    }
    let mut user = TokenUser::service_account(namespace, name, &[]);
    user.uid = account["uid"].as_str()?.to_owned();
    user.audiences = claims["aud"]
        .as_array()?
        .iter()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    Some(user)
}

fn resource(plural: &str) -> &'static resources::Resource {
    resources::find("", "v1", plural).expect("a core resource the server serves")
}

const B64: data_encoding::Encoding = data_encoding::BASE64URL_NOPAD;

fn sign(key: &[u8], claims: &Value) -> String {
    let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = B64.encode(claims.to_string().as_bytes());
    let signed = format!("{header}.{payload}");
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        signed.as_bytes(),
    );
    format!("{signed}.{}", B64.encode(tag.as_ref()))
}

fn signed_claims(key: &[u8], token: &str) -> Option<Value> {
    let (signed, tag) = token.rsplit_once('.')?;
    let (_, payload) = signed.split_once('.')?;
    ring::hmac::verify(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        signed.as_bytes(),
        &B64.decode(tag.as_bytes()).ok()?,
    )
    .ok()?;
    serde_json::from_slice(&B64.decode(payload.as_bytes()).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_account() -> Store {
        let store = Store::new(100);
        store
            .create(
                resource("namespaces"),
                "",
                json!({"metadata": {"name": "default"}}),
            )
            .unwrap();
        store
            .create(
                resource("serviceaccounts"),
                "default",
                json!({"metadata": {"name": "robot"}}),
            )
            .unwrap();
        store
    }

    #[test]
    fn a_minted_token_names_its_account_and_audiences_until_the_account_goes() {
        let (store, key) = (store_with_account(), b"k".repeat(32));
        let answer = request(
            &store,
            &key,
            "default",
            "robot",
            json!({"spec": {"audiences": ["cloud-gateway"], "expirationSeconds": 600}}),
        )
        .unwrap();
        assert_eq!(answer["spec"]["expirationSeconds"], 600);
        let token = answer["status"]["token"].as_str().unwrap();
        let user = verify(&store, &key, token).unwrap();
        assert_eq!(user.username, "system:serviceaccount:default:robot");
        assert_eq!(user.audiences, ["cloud-gateway"]);
        assert!(
            verify(&store, &b"x".repeat(32), token).is_none(),
            "another key"
        );
        let forged = format!("{}x", &token[..token.len() - 1]);
        assert!(
            verify(&store, &key, &forged).is_none(),
            "a changed signature"
        );
        store
            .delete(
                resource("serviceaccounts"),
                "default",
                "robot",
                (None, None),
            )
            .unwrap();
        assert!(verify(&store, &key, token).is_none(), "the account is gone");
    }

    #[test]
    fn an_expired_token_is_refused() {
        let (store, key) = (store_with_account(), b"k".repeat(32));
        let answer = request(&store, &key, "default", "robot", json!({})).unwrap();
        let token = answer["status"]["token"].as_str().unwrap();
        let mut claims = signed_claims(&key, token).unwrap();
        assert!(verify(&store, &key, &sign(&key, &claims)).is_some());
        claims["exp"] = json!(unix_now() - 1);
        assert!(verify(&store, &key, &sign(&key, &claims)).is_none());
    }

    #[test]
    fn requests_out_of_bounds_are_refused() {
        let (store, key) = (store_with_account(), b"k".repeat(32));
        let ask = |spec: Value| request(&store, &key, "default", "robot", json!({"spec": spec}));
        let short = ask(json!({"expirationSeconds": 60})).unwrap_err();
        assert_eq!(short.code, 422);
        assert!(
            short.message.contains("less than 10 minutes"),
            "{}",
            short.message
        );
        let unbound = ask(json!({"boundObjectRef": {"kind": "Pod", "name": "gone"}})).unwrap_err();
        assert!(
            unbound.message.contains("\"gone\" not found"),
            "{}",
            unbound.message
        );
        let missing = request(&store, &key, "default", "nobody", json!({})).unwrap_err();
        assert_eq!(missing.code, 404);
    }
}
