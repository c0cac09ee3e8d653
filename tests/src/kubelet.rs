//! Runs the containers of rendered Deployments as processes, as a kubelet
//! would run them: the rendered command (the image's `/usr/local/bin/<x>`
//! taken from the workspace's build; for one of upstream's images, a build
//! of its binary the test names), args with `$(VAR)` expanded, the
//! environment with the downward API and Service variables resolved, and
//! every volume mounted at its rendered path (ConfigMaps, Secrets,
//! projected ServiceAccount tokens with their audiences, emptyDirs), with
//! the container's readiness probe awaited.
//!
//! Two things differ from a node, on purpose: mounted paths live under a
//! root directory of the test (each path in args and environment that
//! starts with a mount path, or is a `unix://` address under one, is moved
//! under it), and the API credentials a pod finds in-cluster come as
//! `KUBECONFIG` (the test API server speaks plain HTTP, which in-cluster
//! configuration refuses).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::process::{Child, Command};

use kube_test_apiserver::{ApiServer, TokenUser};

/// What a container runs in.
pub struct Node<'a> {
    pub api: &'a ApiServer,
    /// Every rendered object (ConfigMaps, Secrets, Services are looked up).
    pub objects: &'a [Value],
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// Under which mounted paths live.
    pub root: PathBuf,
    /// Secrets that exist in the cluster beside the chart's own, by name.
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
}

/// A container running as a process.
pub struct Container {
    /// `<deployment>/<container>`.
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Container {
    /// The container's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log: enough to see why, short enough
    /// that the line saying what failed, printed after it, stays in view.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The Deployments among `objects`, with their pod specs.
pub fn deployments(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .collect()
}

impl Node<'_> {
    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The files of a Secret, the chart's own or one given.
    fn secret(&self, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
        if let Some(given) = self.secrets.get(name) {
            return Ok(given.clone());
        }
        let secret = self
            .find("Secret", name)
            .with_context(|| format!("Secret {name} is neither rendered nor given"))?;
        let mut out = BTreeMap::new();
        if let Some(data) = secret["stringData"].as_object() {
            for (k, v) in data {
                out.insert(k.clone(), text(v).to_owned());
            }
        }
        if secret["data"].as_object().is_some_and(|d| !d.is_empty()) {
            bail!("Secret {name}: base64 data is not supported here, use stringData");
        }
        Ok(out)
    }

    fn config_map(&self, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let map = self
            .find("ConfigMap", name)
            .with_context(|| format!("ConfigMap {name} is not rendered"))?;
        Ok(map["data"]
            .as_object()
            .map(|d| {
                d.iter()
                    .map(|(k, v)| (k.clone(), text(v).to_owned()))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// A token of the pod's ServiceAccount for `audiences` (none: the API
    /// server's own).
    fn token(&self, namespace: &str, account: &str, audiences: &[&str]) -> String {
        let token = random_token();
        self.api.register_token(
            token.clone(),
            TokenUser::service_account(namespace, account, audiences),
        );
        token
    }

    /// Writes the files of volume `volume` into `dir`; with `items`, only
    /// the keys they name, at their paths (a key missing fails the mount,
    /// as the kubelet's does).
    fn mount(
        &self,
        namespace: &str,
        account: &str,
        volume: &Value,
        dir: &Path,
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        // Every file owner-only, as a Secret's are mounted (defaultMode
        // 0400 in the chart) and as tokens are.
        let write = |files: BTreeMap<String, String>| -> anyhow::Result<()> {
            for (name, content) in files {
                ccm_runtime::files::write_private(&dir.join(name), content.as_bytes())?;
            }
            Ok(())
        };
        if volume.get("emptyDir").is_some() {
            Ok(())
        } else if let Some(map) = volume.get("configMap") {
            write(self.config_map(text(&map["name"]))?)
        } else if let Some(secret) = volume.get("secret") {
            write(items(
                self.secret(text(&secret["secretName"]))?,
                &secret["items"],
            )?)
        } else if let Some(projected) = volume.get("projected") {
            for source in projected["sources"].as_array().into_iter().flatten() {
                if let Some(sa) = source.get("serviceAccountToken") {
                    let audience = text(&sa["audience"]);
                    let audiences: Vec<&str> =
                        [audience].into_iter().filter(|a| !a.is_empty()).collect();
                    ccm_runtime::files::write_private(
                        &dir.join(text(&sa["path"])),
                        self.token(namespace, account, &audiences).as_bytes(),
                    )?;
                } else if let Some(map) = source.get("configMap") {
                    write(self.config_map(text(&map["name"]))?)?;
                } else if let Some(secret) = source.get("secret") {
                    write(self.secret(text(&secret["name"]))?)?;
                } else {
                    bail!("unsupported projected source {source}");
                }
            }
            Ok(())
        } else {
            bail!("unsupported volume {volume}")
        }
    }

    /// Starts container `index` of `deployment` as pod `pod`.
    pub async fn start(
        &self,
        deployment: &Value,
        index: usize,
        pod: &str,
    ) -> anyhow::Result<Container> {
        self.start_from(deployment, index, pod, None).await
    }

    /// Starts container `index` of `deployment`, one of upstream's images
    /// (no command: the image's entrypoint), in pod `pod` as `program`, a
    /// build of that image's binary. Containers of one pod share its
    /// mounted volumes (an emptyDir's socket). Upstream's sidecars read no
    /// `KUBECONFIG`: the pod's API credentials come as `--kubeconfig`.
    pub async fn start_upstream(
        &self,
        deployment: &Value,
        index: usize,
        pod: &str,
        program: &Path,
    ) -> anyhow::Result<Container> {
        self.start_from(deployment, index, pod, Some(program)).await
    }

    async fn start_from(
        &self,
        deployment: &Value,
        index: usize,
        pod: &str,
        upstream: Option<&Path>,
    ) -> anyhow::Result<Container> {
        let namespace = text(&deployment["metadata"]["namespace"]).to_owned();
        let spec = &deployment["spec"]["template"]["spec"];
        let container = &spec["containers"][index];
        let name = format!(
            "{}/{}",
            text(&deployment["metadata"]["name"]),
            text(&container["name"])
        );
        let account = text(&spec["serviceAccountName"]).to_owned();
        let pod_root = self.root.join(pod);

        // Volumes at their mount paths, under the pod's root.
        let mut mounts: Vec<String> = Vec::new();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let volume = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == mount["name"])
                .with_context(|| format!("{name}: no volume {}", mount["name"]))?;
            let path = text(&mount["mountPath"]).to_owned();
            self.mount(
                &namespace,
                &account,
                volume,
                &pod_root.join(path.trim_start_matches('/')),
            )?;
            mounts.push(path);
        }
        // Longest first, so /a/b is moved before /a.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        // A path under a mount, bare or as a unix socket's address
        // (unix:///csi/csi.sock), moved under the pod's root.
        let moved = |path: &str| -> Option<String> {
            let (scheme, path) = match path.strip_prefix("unix://") {
                Some(rest) => ("unix://", rest),
                None => ("", path),
            };
            mounts.iter().find_map(|m| {
                (path == m || path.starts_with(&format!("{m}/"))).then(|| {
                    let under = pod_root.join(m.trim_start_matches('/'));
                    format!("{scheme}{}{}", under.display(), &path[m.len()..])
                })
            })
        };
        let reroot = |value: &str| -> String {
            if let Some(path) = moved(value) {
                return path;
            }
            if let Some((flag, path)) = value.split_once('=')
                && let Some(path) = moved(path)
            {
                return format!("{flag}={path}");
            }
            value.to_owned()
        };

        // The environment a kubelet gives the container.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for service in self
            .objects
            .iter()
            .filter(|o| o["kind"] == "Service" && o["metadata"]["namespace"] == namespace.as_str())
        {
            let var = text(&service["metadata"]["name"])
                .to_uppercase()
                .replace('-', "_");
            let port = service["spec"]["ports"][0]["port"]
                .as_i64()
                .unwrap_or_default();
            env.insert(format!("{var}_SERVICE_HOST"), "127.0.0.1".into());
            env.insert(format!("{var}_SERVICE_PORT"), port.to_string());
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let key = text(&var["name"]).to_owned();
            let value = if let Some(v) = var.get("value") {
                text(v).to_owned()
            } else if let Some(field) = var.pointer("/valueFrom/fieldRef/fieldPath") {
                match text(field) {
                    "metadata.name" => pod.to_owned(),
                    "metadata.namespace" => namespace.clone(),
                    "spec.nodeName" => "node-0".into(),
                    "spec.serviceAccountName" => account.clone(),
                    "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
                    other => bail!("{name}: unsupported fieldRef {other}"),
                }
            } else if let Some(key_ref) = var.pointer("/valueFrom/secretKeyRef") {
                self.secret(text(&key_ref["name"]))?
                    .get(text(&key_ref["key"]))
                    .cloned()
                    .with_context(|| format!("{name}: no key {key_ref}"))?
            } else {
                bail!("{name}: unsupported env {var}");
            };
            env.insert(key, reroot(&value));
        }
        // In-cluster API credentials, as a kubeconfig (see the module docs).
        let kubeconfig = pod_root.join("kubeconfig");
        std::fs::create_dir_all(&pod_root)?;
        ccm_runtime::files::write_private(
            &kubeconfig,
            kube_test_apiserver::kubeconfig(
                &self.api.url(),
                &self.api.pki().ca_pem,
                &account,
                &self.token(&namespace, &account, &[]),
            )
            .as_bytes(),
        )?;
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());

        // $(VAR) in args, as the kubelet expands them.
        let expand = |arg: &str| -> String {
            let mut out = arg.to_owned();
            for (k, v) in &env {
                out = out.replace(&format!("$({k})"), v);
            }
            out
        };
        let mut args: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .skip(1)
            .chain(container["args"].as_array().into_iter().flatten())
            .map(|a| reroot(&expand(text(a))))
            .collect();
        let program = match upstream {
            Some(program) => {
                if !container["command"].is_null() {
                    bail!("{name}: upstream's image runs its own entrypoint, not a command");
                }
                args.push(format!("--kubeconfig={}", kubeconfig.display()));
                program.to_path_buf()
            }
            None => {
                let command = container["command"][0].as_str().context("no command")?;
                let binary = command.strip_prefix("/usr/local/bin/").with_context(|| {
                    format!("{name}: the image holds its binaries in /usr/local/bin, not {command}")
                })?;
                self.bin_dir.join(binary)
            }
        };
        let log = self
            .root
            .join(format!("{pod}-{}.log", text(&container["name"])));
        let child = Command::new(&program)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&env)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("{name}: start {}", program.display()))?;
        Ok(Container { name, child, log })
    }

    /// Waits until `container`'s readiness probe passes; fails naming the
    /// container if it exits first or is not ready within `within`.
    pub async fn ready(
        &self,
        deployment: &Value,
        index: usize,
        container: &mut Container,
        within: Duration,
    ) -> anyhow::Result<()> {
        let spec = &deployment["spec"]["template"]["spec"]["containers"][index];
        let probe = &spec["readinessProbe"]["httpGet"];
        let port = match &probe["port"] {
            Value::Number(n) => n.as_u64().unwrap_or_default(),
            Value::String(named) => spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == named.as_str())
                .and_then(|p| p["containerPort"].as_u64())
                .with_context(|| format!("{}: no port {named}", container.name))?,
            _ => bail!("{}: no readiness probe", container.name),
        };
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port as u16));
        let started = Instant::now();
        loop {
            if let Some(status) = container.child.try_wait()? {
                bail!(
                    "{}\ncontainer {} exited ({status}) before it was ready (its log's end above)",
                    container.log_tail(100),
                    container.name,
                );
            }
            let path = text(&probe["path"]);
            let answer = if probe["scheme"] == "HTTPS" {
                ccm_sandbox::admin::admin_get(address, path, None).await
            } else {
                ccm_sandbox::admin::try_http_get(address, path).await
            };
            if let Ok((200, _)) = answer {
                return Ok(());
            }
            if started.elapsed() > within {
                bail!(
                    "{}\ncontainer {} not ready within {within:?} (its log's end above)",
                    container.log_tail(100),
                    container.name,
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The files of a Secret or ConfigMap volume with `items`: only the keys
/// named, at their paths; all of them without.
fn items(
    files: BTreeMap<String, String>,
    items: &Value,
) -> anyhow::Result<BTreeMap<String, String>> {
    let Some(items) = items.as_array() else {
        return Ok(files);
    };
    items
        .iter()
        .map(|item| {
            let key = text(&item["key"]);
            let content = files
                .get(key)
                .with_context(|| format!("no key {key} to mount"))?;
            Ok((text(&item["path"]).to_owned(), content.clone()))
        })
        .collect()
}
