//! The image, built and started on this machine. Registries cannot be
//! reached here, so the Dockerfile's base images cannot be pulled; this
//! recipe builds the same layout with buildah from scratch (the
//! binaries in /usr/local/bin, the shared libraries `ldd` lists, the
//! Dockerfile's own USER and ENTRYPOINT lines) and runs it with podman as
//! the chart does: non-root, read-only root filesystem, writable state and
//! /tmp only. The gateway inside must answer its gRPC health check.
//! `.ci/run` installs buildah, podman and runc.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BINARIES: [&str; 6] = [
    "cloud-gateway",
    "node-controller",
    "service-controller",
    "route-controller",
    "volume-controller",
    "aws-preflight",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a container tool with this repo's containers.conf; returns stdout.
fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .env("CONTAINERS_CONF", repo().join("tests/containers.conf"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is not installed ({e}); .ci/run installs it"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The shared libraries `binary` loads, as absolute paths.
fn libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The Dockerfile's final-stage lines starting with `instruction`.
fn dockerfile_lines(instruction: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let last_stage = text
        .rsplit("\nFROM ")
        .next()
        .unwrap_or_default()
        .replace("\\\n", " ");
    last_stage
        .lines()
        .filter(|l| l.starts_with(instruction))
        .map(str::to_owned)
        .collect()
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let conf = repo().join("tests/containers.conf");
        let _ = Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["rm", "-f", &self.0])
            .output();
        let _ = Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_the_gateway_as_non_root_on_a_read_only_root() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/local/bin")).unwrap();
    for binary in BINARIES {
        let from = ccm_testkit::bin_dir().join(binary);
        std::fs::copy(&from, rootfs.join("usr/local/bin").join(binary)).unwrap();
        for lib in libraries(&from) {
            let to = rootfs.join(lib.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(std::fs::canonicalize(&lib).unwrap(), to).unwrap();
        }
    }
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(
        rootfs.join("etc/passwd"),
        "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(rootfs.join("etc/group"), "nonroot:x:65532:\n").unwrap();
    // The layout, user and entrypoint are the Dockerfile's own.
    let copy = dockerfile_lines("COPY").join(" ");
    assert!(copy.contains("/usr/local/bin/"), "{copy}");
    let user = dockerfile_lines("USER");
    let entrypoint = dockerfile_lines("ENTRYPOINT");
    assert_eq!(user, ["USER 65532:65532"]);
    assert_eq!(entrypoint.len(), 1);
    std::fs::write(
        dir.path().join("Containerfile"),
        format!(
            "FROM scratch\nCOPY rootfs/ /\n{}\n{}\n",
            user[0], entrypoint[0]
        ),
    )
    .unwrap();
    let name = format!("ccm-image-test-{}", uuid::Uuid::new_v4().simple());
    let _cleanup = Cleanup(name.clone());
    let context = dir.path().to_str().unwrap();
    tool(
        "buildah",
        &[
            "bud",
            "-q",
            "-t",
            &name,
            "-f",
            &format!("{context}/Containerfile"),
            context,
        ],
    );

    let grpc = ccm_sandbox::ports::free_port().unwrap();
    let admin = ccm_sandbox::ports::free_port().unwrap();
    tool(
        "podman",
        &[
            "run",
            "--runtime",
            "runc",
            "-d",
            "--name",
            &name,
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/var/lib/cloud-gateway",
            "--network",
            "host",
            &name,
            "--provider",
            "sim",
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
            "--state-dir",
            "/var/lib/cloud-gateway",
            // On the host's loopback only.
            "--insecure-plaintext",
            "true",
        ],
    );
    let inspect: serde_json::Value =
        serde_json::from_str(&tool("podman", &["inspect", &name])).unwrap();
    assert_eq!(inspect[0]["Config"]["User"], "65532:65532");
    assert_eq!(inspect[0]["HostConfig"]["ReadonlyRootfs"], true);

    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .connect_lazy();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let started = Instant::now();
    loop {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "cloudgateway.v1.Instances".into(),
            })
            .await;
        if let Ok(answer) = answer
            && answer.get_ref().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway in the image did not become healthy:\n{}",
            tool("podman", &["logs", &name])
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The process inside runs as the non-root user.
    let pid = tool("podman", &["inspect", "-f", "{{.State.Pid}}", &name]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65532"),
        "{uid}"
    );
}
