//! The gateway's EBS volumes over real gRPC, against moto (an AWS API
//! emulator) started by each test, each result read back with boto3 as a
//! user would inspect the account. The gateway is the real binary with
//! dummy credentials in its environment, as in a pod.

use std::time::Duration;

use ccm_proto::v1::{
    AttachVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest,
    DeleteVolumeRequest, DetachVolumeRequest, ExpandVolumeRequest, GetVolumeRequest,
    ListSnapshotsRequest, ListVolumesRequest, ModifyVolumeRequest, VolumeOwner,
};
use ccm_proto::{Error, GatewayClient};
use ccm_sandbox::aws::{self, Moto, Seeded};
use ccm_sandbox::gateway::GatewayProcess;
use serde_json::Value;

const CLUSTER: &str = "kubernetes";
const TIMEOUT: Duration = Duration::from_secs(90);
const GIB: i64 = 1 << 30;

struct Env {
    _dir: tempfile::TempDir,
    moto: Moto,
    ec2: aws_sdk_ec2::Client,
    seeded: Seeded,
    gateway: GatewayProcess,
}

/// moto with one cluster of `instances` seeded, and the gateway on it.
async fn env(instances: usize) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto")).await.unwrap();
    let ec2 = moto.ec2();
    let seeded = aws::seed(&ec2, CLUSTER, instances).await.unwrap();
    let secret = aws::secret_access_key();
    let args: Vec<String> = [
        "--provider",
        "aws",
        "--aws-endpoint-url",
        &moto.endpoint,
        "--aws-vpc-id",
        &seeded.vpc,
        "--cache-ttl",
        "0s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let gateway = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &dir.path().join("gateway"),
        &args,
        &aws::credentials_env(&secret, dir.path()),
    )
    .await
    .unwrap();
    assert!(
        gateway.wait_ready(TIMEOUT).await,
        "gateway not ready:\n{}",
        gateway.log_text()
    );
    Env {
        _dir: dir,
        moto,
        ec2,
        seeded,
        gateway,
    }
}

async fn timed<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .expect("test step timed out")
}

/// Calls `call` again while the gateway answers "retry after" (a volume
/// still attaching or detaching), at most for [`TIMEOUT`].
async fn until_done<T, F, Fut>(mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    timed(async {
        loop {
            match call().await {
                Err(Error::RetryAfter { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                done => return done,
            }
        }
    })
    .await
}

fn create(name: &str, size_bytes: i64, zone: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        size_bytes,
        zones: if zone.is_empty() {
            Vec::new()
        } else {
            vec![zone.to_owned()]
        },
        ..Default::default()
    }
}

async fn create_id(c: &GatewayClient, req: CreateVolumeRequest) -> String {
    timed(c.create_volume(req))
        .await
        .unwrap()
        .volume
        .unwrap()
        .id
}

async fn attach(c: &GatewayClient, volume_id: &str, instance_id: &str) -> Result<String, Error> {
    until_done(|| {
        c.attach_volume(AttachVolumeRequest {
            volume_id: volume_id.into(),
            instance_id: instance_id.into(),
            ..Default::default()
        })
    })
    .await
    .map(|a| a.device)
}

async fn detach(c: &GatewayClient, volume_id: &str, instance_id: &str) -> Result<(), Error> {
    until_done(|| {
        c.detach_volume(DetachVolumeRequest {
            volume_id: volume_id.into(),
            instance_id: instance_id.into(),
            ..Default::default()
        })
    })
    .await
    .map(drop)
}

async fn delete(c: &GatewayClient, volume_id: &str) -> Result<(), Error> {
    timed(c.delete_volume(DeleteVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    }))
    .await
    .map(drop)
}

async fn get(c: &GatewayClient, volume_id: &str) -> Result<ccm_proto::v1::Volume, Error> {
    timed(c.get_volume(GetVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    }))
    .await
    .map(|g| g.volume.unwrap())
}

/// The account's tagged volumes (not the instances' untagged root disks)
/// as boto3 reads them: for each, its ID, size, zone, type, IOPS,
/// throughput, snapshot, tags
/// as an object and attachments as `[instance, device]`, sorted by ID.
fn volumes_by_boto3(endpoint: &str) -> Vec<Value> {
    let script = "import boto3, json, sys\n\
        ec2 = boto3.client('ec2', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        out = [{'id': v['VolumeId'], 'size': v['Size'], 'zone': v['AvailabilityZone'],\n\
            'type': v['VolumeType'], 'iops': v.get('Iops'), 'throughput': v.get('Throughput'),\n\
            'snapshot': v.get('SnapshotId', ''),\n\
            'tags': {t['Key']: t['Value'] for t in v.get('Tags', [])},\n\
            'attachments': sorted([a['InstanceId'], a['Device']] for a in v['Attachments'])}\n\
            for v in ec2.describe_volumes()['Volumes']]\n\
        print(json.dumps(sorted(out, key=lambda v: v['id'])))\n";
    ccm_testkit::boto3(script, endpoint, &[])
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["tags"].as_object().is_some_and(|t| !t.is_empty()))
        .cloned()
        .collect()
}

/// The volume `id` as boto3 reads it ([`volumes_by_boto3`]).
fn volume_by_boto3(endpoint: &str, id: &str) -> Option<Value> {
    volumes_by_boto3(endpoint)
        .into_iter()
        .find(|v| v["id"] == id)
}

/// The account's own snapshots as boto3 reads them: ID, volume, tags.
fn snapshots_by_boto3(endpoint: &str) -> Vec<Value> {
    let script = "import boto3, json, sys\n\
        ec2 = boto3.client('ec2', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        out = [{'id': s['SnapshotId'], 'volume': s['VolumeId'],\n\
                'tags': {t['Key']: t['Value'] for t in s.get('Tags', [])}}\n\
            for s in ec2.describe_snapshots(OwnerIds=['self'])['Snapshots']]\n\
        print(json.dumps(out))\n";
    ccm_testkit::boto3(script, endpoint, &[])
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["tags"].get("CSIVolumeSnapshotName").is_some())
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_volume_created_twice_is_one_ec2_volume_with_upstreams_tags() {
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let zone = env.seeded.instances[0].zone.clone();
    let mut req = create("pvc-0001", 2 * GIB + 1, &zone);
    req.owner = Some(VolumeOwner {
        pvc_namespace: "shop".into(),
        pvc_name: "data".into(),
        pv_name: "pvc-0001".into(),
    });
    let first = create_id(&c, req.clone()).await;
    let second = create_id(&c, req.clone()).await;
    assert_eq!(first, second);
    assert!(first.starts_with("vol-"), "{first}");

    let all = volumes_by_boto3(&env.moto.endpoint);
    assert_eq!(all.len(), 1, "{all:?}");
    let volume = &all[0];
    assert_eq!(volume["id"], first.as_str());
    assert_eq!(volume["size"], 3, "2 GiB and a byte round up to 3 GiB");
    assert_eq!(volume["zone"], zone.as_str());
    assert_eq!(volume["type"], "gp3");
    for (key, value) in [
        ("CSIVolumeName", "pvc-0001"),
        ("ebs.csi.aws.com/cluster", "true"),
        ("kubernetes.io/cluster/kubernetes", "owned"),
        ("kubernetes.io/created-for/pvc/name", "data"),
        ("kubernetes.io/created-for/pvc/namespace", "shop"),
        ("kubernetes.io/created-for/pv/name", "pvc-0001"),
    ] {
        assert_eq!(volume["tags"][key], value, "{key} in {volume}");
    }

    let other_size = timed(c.create_volume(create("pvc-0001", 5 * GIB, &zone))).await;
    assert!(
        matches!(other_size, Err(Error::AlreadyExists { .. })),
        "{other_size:?}"
    );
    let other_type = timed(c.create_volume(CreateVolumeRequest {
        parameters: [("type".to_owned(), "gp2".to_owned())].into(),
        ..req.clone()
    }))
    .await;
    assert!(
        matches!(other_type, Err(Error::AlreadyExists { .. })),
        "{other_type:?}"
    );
    let unknown = timed(
        c.create_volume(CreateVolumeRequest {
            name: "pvc-0002".into(),
            parameters: [
                ("color".to_owned(), "blue".to_owned()),
                ("size".to_owned(), "big".to_owned()),
            ]
            .into(),
            ..req.clone()
        }),
    )
    .await;
    match unknown {
        Err(Error::InvalidArgument { violations, .. }) => {
            let mut fields: Vec<String> = violations.into_iter().map(|v| v.field).collect();
            fields.sort();
            assert_eq!(fields, ["parameters[\"color\"]", "parameters[\"size\"]"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(volumes_by_boto3(&env.moto.endpoint).len(), 1);

    let listed = timed(c.list_volumes(ListVolumesRequest::default()))
        .await
        .unwrap();
    let ids: Vec<&str> = listed.volumes.iter().map(|v| v.id.as_str()).collect();
    assert_eq!(ids, [first.as_str()]);
    let theirs = env.gateway.client("volume", "other");
    assert!(matches!(
        get(&theirs, &first).await,
        Err(Error::NotFound { .. })
    ));
    assert!(
        timed(theirs.list_volumes(ListVolumesRequest::default()))
            .await
            .unwrap()
            .volumes
            .is_empty()
    );
}

#[tokio::test]
async fn two_attaches_to_one_instance_at_once_get_two_devices_and_detach_and_delete_leave_nothing()
{
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let instance = env.seeded.instances[0].clone();
    let a = create_id(&c, create("pvc-a", GIB, &instance.zone)).await;
    let b = create_id(&c, create("pvc-b", GIB, &instance.zone)).await;

    let (da, db) = tokio::join!(attach(&c, &a, &instance.id), attach(&c, &b, &instance.id));
    let (da, db) = (da.unwrap(), db.unwrap());
    assert_ne!(da, db);
    for device in [&da, &db] {
        assert!(
            ["/dev/xvdaa", "/dev/xvdab"].contains(&device.as_str()),
            "{device}"
        );
    }
    for (id, device) in [(&a, &da), (&b, &db)] {
        let seen = volume_by_boto3(&env.moto.endpoint, id).unwrap();
        assert_eq!(
            seen["attachments"],
            serde_json::json!([[instance.id, device]]),
            "{seen}"
        );
    }
    // Again: the same device, and nothing new in EC2.
    assert_eq!(attach(&c, &a, &instance.id).await.unwrap(), da);
    let got = get(&c, &a).await.unwrap();
    assert_eq!(got.attachments.len(), 1, "{got:?}");
    assert_eq!(got.attachments[0].device, da);

    // An attached volume is not deleted.
    let in_use = delete(&c, &a).await;
    assert!(in_use.is_err(), "{in_use:?}");
    assert!(volume_by_boto3(&env.moto.endpoint, &a).is_some());

    for id in [&a, &b] {
        detach(&c, id, &instance.id).await.unwrap();
        detach(&c, id, &instance.id).await.unwrap();
        let seen = volume_by_boto3(&env.moto.endpoint, id).unwrap();
        assert_eq!(seen["attachments"], serde_json::json!([]), "{seen}");
    }
    for id in [&a, &b] {
        delete(&c, id).await.unwrap();
        delete(&c, id).await.unwrap();
    }
    assert_eq!(volumes_by_boto3(&env.moto.endpoint), Vec::<Value>::new());
    // A missing volume, or one on a missing instance.
    assert!(matches!(
        attach(&c, &a, &instance.id).await,
        Err(Error::NotFound { .. })
    ));
    detach(&c, &a, &instance.id).await.unwrap();
}

/// Makes a volume in EC2 directly (not through the gateway) with `tags`.
async fn foreign_volume(env: &Env, tags: &[(&str, &str)]) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut spec = TagSpecification::builder().resource_type(ResourceType::Volume);
    for (k, v) in tags {
        spec = spec.tags(Tag::builder().key(*k).value(*v).build());
    }
    env.ec2
        .create_volume()
        .availability_zone(&env.seeded.instances[0].zone)
        .size(1)
        .tag_specifications(spec.build())
        .send()
        .await
        .unwrap()
        .volume_id()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_volume_without_the_clusters_tag_is_never_attached_detached_or_deleted() {
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let instance = env.seeded.instances[0].clone();
    let untagged = foreign_volume(&env, &[("CSIVolumeName", "pvc-x")]).await;
    let others = foreign_volume(
        &env,
        &[
            ("CSIVolumeName", "pvc-y"),
            ("kubernetes.io/cluster/other", "owned"),
        ],
    )
    .await;
    for id in [&untagged, &others] {
        assert!(matches!(get(&c, id).await, Err(Error::NotFound { .. })));
        let attached = attach(&c, id, &instance.id).await;
        assert!(
            matches!(attached, Err(Error::NotFound { .. })),
            "{attached:?}"
        );
        delete(&c, id).await.unwrap();
    }
    // Another cluster's volume, attached by it, stays attached.
    env.ec2
        .attach_volume()
        .volume_id(&others)
        .instance_id(&instance.id)
        .device("/dev/xvdzz")
        .send()
        .await
        .unwrap();
    detach(&c, &others, &instance.id).await.unwrap();
    let all = volumes_by_boto3(&env.moto.endpoint);
    assert_eq!(all.len(), 2, "{all:?}");
    let seen = volume_by_boto3(&env.moto.endpoint, &others).unwrap();
    assert_eq!(
        seen["attachments"],
        serde_json::json!([[instance.id, "/dev/xvdzz"]])
    );
    // A volume named like theirs is made anew for this cluster.
    let ours = create_id(&c, create("pvc-y", GIB, &instance.zone)).await;
    assert_ne!(ours, others);
    // Its device is not the one their volume holds.
    let device = attach(&c, &ours, &instance.id).await.unwrap();
    assert_ne!(device, "/dev/xvdzz");
    let listed = timed(c.list_volumes(ListVolumesRequest::default()))
        .await
        .unwrap();
    let ids: Vec<&str> = listed.volumes.iter().map(|v| v.id.as_str()).collect();
    assert_eq!(ids, [ours.as_str()]);
}

#[tokio::test]
async fn volumes_grow_and_snapshots_are_tagged_listed_restored_and_deleted() {
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let zone = env.seeded.instances[0].zone.clone();
    let id = create_id(&c, create("pvc-grow", GIB, &zone)).await;
    let grown = timed(c.expand_volume(ExpandVolumeRequest {
        volume_id: id.clone(),
        size_bytes: 4 * GIB + 1,
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(grown.size_bytes, 5 * GIB);
    assert_eq!(volume_by_boto3(&env.moto.endpoint, &id).unwrap()["size"], 5);

    let snapshot = |name: &str, volume: &str| CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: volume.into(),
        ..Default::default()
    };
    let first = timed(c.create_snapshot(snapshot("snap-0001", &id)))
        .await
        .unwrap()
        .snapshot
        .unwrap();
    let again = timed(c.create_snapshot(snapshot("snap-0001", &id)))
        .await
        .unwrap()
        .snapshot
        .unwrap();
    assert_eq!(first.id, again.id);
    let seen = snapshots_by_boto3(&env.moto.endpoint);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["volume"], id.as_str());
    assert_eq!(seen[0]["tags"]["CSIVolumeSnapshotName"], "snap-0001");
    assert_eq!(seen[0]["tags"]["kubernetes.io/cluster/kubernetes"], "owned");
    let listed = timed(c.list_snapshots(ListSnapshotsRequest::default()))
        .await
        .unwrap();
    let ids: Vec<&str> = listed.snapshots.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [first.id.as_str()]);

    let restored = create_id(
        &c,
        CreateVolumeRequest {
            source_snapshot_id: first.id.clone(),
            ..create("pvc-restored", 5 * GIB, &zone)
        },
    )
    .await;
    assert_eq!(
        volume_by_boto3(&env.moto.endpoint, &restored).unwrap()["snapshot"],
        first.id.as_str()
    );
    let smaller = timed(c.create_volume(CreateVolumeRequest {
        source_snapshot_id: first.id.clone(),
        ..create("pvc-smaller", GIB, &zone)
    }))
    .await;
    assert!(
        matches!(smaller, Err(Error::InvalidArgument { .. })),
        "{smaller:?}"
    );

    for _ in 0..2 {
        timed(c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: first.id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap();
    }
    assert_eq!(snapshots_by_boto3(&env.moto.endpoint), Vec::<Value>::new());
}

#[tokio::test]
async fn a_volumes_type_iops_and_throughput_change_in_place_and_only_when_they_differ() {
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let zone = env.seeded.instances[0].zone.clone();
    let modify = |id: &str, pairs: &[(&str, &str)]| ModifyVolumeRequest {
        volume_id: id.to_owned(),
        parameters: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    // Made with a VolumeAttributesClass's parameters over the class's.
    let id = create_id(
        &c,
        CreateVolumeRequest {
            mutable_parameters: [("iops".to_owned(), "3500".to_owned())].into(),
            ..create("pvc-modify", 10 * GIB, &zone)
        },
    )
    .await;
    let made = volume_by_boto3(&env.moto.endpoint, &id).unwrap();
    assert_eq!(
        (&made["type"], &made["iops"]),
        (&"gp3".into(), &3500.into())
    );

    let faster = modify(&id, &[("iops", "4000"), ("throughput", "250")]);
    timed(c.modify_volume(faster.clone())).await.unwrap();
    let seen = volume_by_boto3(&env.moto.endpoint, &id).unwrap();
    assert_eq!(seen["iops"], 4000);
    assert_eq!(seen["throughput"], 250);
    assert_eq!(ccm_testkit::ebs_modifications(&env.moto.endpoint, &id), 1);
    // Asked again (the resizer's retry): EBS takes few modifications a
    // day, so none is made for what the volume has.
    timed(c.modify_volume(faster)).await.unwrap();
    assert_eq!(ccm_testkit::ebs_modifications(&env.moto.endpoint, &id), 1);

    // What EBS would refuse is named, and nothing is changed.
    let wrong = timed(c.modify_volume(modify(
        &id,
        &[
            ("type", "gp2"),
            ("throughput", "300"),
            ("encrypted", "true"),
        ],
    )))
    .await;
    match wrong {
        Err(Error::InvalidArgument { violations, .. }) => {
            let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
            assert_eq!(
                fields,
                ["parameters[\"encrypted\"]", "parameters[\"throughput\"]"]
            );
        }
        other => panic!("not invalid: {other:?}"),
    }
    // Made io2, the volume takes no throughput: its own type is checked.
    timed(c.modify_volume(modify(&id, &[("type", "io2"), ("iops", "6000")])))
        .await
        .unwrap();
    let wrong = timed(c.modify_volume(modify(&id, &[("throughput", "300")]))).await;
    assert!(
        matches!(wrong, Err(Error::InvalidArgument { .. })),
        "{wrong:?}"
    );
    assert_eq!(ccm_testkit::ebs_modifications(&env.moto.endpoint, &id), 2);
    let seen = volume_by_boto3(&env.moto.endpoint, &id).unwrap();
    assert_eq!(
        (&seen["type"], &seen["iops"]),
        (&"io2".into(), &6000.into())
    );

    // Another cluster's volume is not found, and stays as it was.
    let theirs = foreign_volume(
        &env,
        &[
            ("CSIVolumeName", "pvc-theirs"),
            ("kubernetes.io/cluster/other", "owned"),
        ],
    )
    .await;
    let refused = timed(c.modify_volume(modify(&theirs, &[("type", "gp3")]))).await;
    assert!(
        matches!(refused, Err(Error::NotFound { .. })),
        "{refused:?}"
    );
    assert_eq!(
        ccm_testkit::ebs_modifications(&env.moto.endpoint, &theirs),
        0
    );
    // Asked to change nothing, it is still not found, as CSI asks.
    let nothing = timed(c.modify_volume(modify(&theirs, &[]))).await;
    assert!(
        matches!(nothing, Err(Error::NotFound { .. })),
        "{nothing:?}"
    );
    timed(c.modify_volume(modify(&id, &[]))).await.unwrap();
}

/// A claim's size and its VolumeAttributesClass edited at once: the
/// resizer's two controllers ask for a resize and a change each on its
/// own. EBS makes one modification of a volume at a time (and no other
/// for six hours), so the gateway makes both with one ModifyVolume, and
/// refuses, for now, a change that contradicts one being made.
#[tokio::test]
async fn a_resize_and_a_change_asked_together_are_one_ebs_modification() {
    let env = env(1).await;
    let c = env.gateway.client("volume", CLUSTER);
    let zone = env.seeded.instances[0].zone.clone();
    let id = create_id(&c, create("pvc-together", 10 * GIB, &zone)).await;
    let modify = |pairs: &[(&str, &str)]| ModifyVolumeRequest {
        volume_id: id.clone(),
        parameters: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let expand = ExpandVolumeRequest {
        volume_id: id.clone(),
        size_bytes: 20 * GIB,
        ..Default::default()
    };
    let (grown, changed) = timed(async {
        tokio::join!(
            c.expand_volume(expand.clone()),
            c.modify_volume(modify(&[("type", "io2"), ("iops", "6000")])),
        )
    })
    .await;
    assert_eq!(grown.unwrap().size_bytes, 20 * GIB);
    changed.unwrap();
    assert_eq!(ccm_testkit::ebs_modifications(&env.moto.endpoint, &id), 1);
    let seen = volume_by_boto3(&env.moto.endpoint, &id).unwrap();
    assert_eq!(
        (&seen["size"], &seen["type"], &seen["iops"]),
        (&20.into(), &"io2".into(), &6000.into())
    );

    // Two changes at once that contradict each other: one is made, the
    // other is asked again later (the resizer retries).
    let (first, second) = timed(async {
        tokio::join!(
            c.modify_volume(modify(&[("iops", "7000")])),
            c.modify_volume(modify(&[("iops", "8000")])),
        )
    })
    .await;
    let refused = [&first, &second]
        .iter()
        .filter(|r| matches!(r, Err(Error::RetryAfter { .. })))
        .count();
    assert_eq!(refused, 1, "{first:?} {second:?}");
    assert_eq!(ccm_testkit::ebs_modifications(&env.moto.endpoint, &id), 2);
}
