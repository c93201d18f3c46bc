//! Tests of the pod-resources wire format, device merging and the failure modes that need no
//! server (the full Get/List exchange is tested against `plexus_e2e::fake_kubelet`).

use super::proto::*;
use super::*;
use prost::Message;
use std::time::Instant;

fn dev(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.to_string(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: None,
    }
}

fn pod(ns: &str, name: &str, containers: Vec<(&str, Vec<ContainerDevices>)>) -> PodResources {
    PodResources {
        name: name.to_string(),
        namespace: ns.to_string(),
        containers: containers
            .into_iter()
            .map(|(c, devices)| ContainerResources {
                name: c.to_string(),
                devices,
                cpu_ids: vec![],
                dynamic_resources: vec![],
            })
            .collect(),
    }
}

/// Hand-computed encoding of a one-pod, one-container, one-device response with NUMA node 1.
const LIST_BYTES: &[u8] = &[
    0x0a, 0x19, // ListPodResourcesResponse.pod_resources (1, LEN 25)
    0x0a, 0x01, b'p', // PodResources.name (1)
    0x12, 0x01, b'n', // PodResources.namespace (2)
    0x1a, 0x11, // PodResources.containers (3, LEN 17)
    0x0a, 0x01, b'c', // ContainerResources.name (1)
    0x12, 0x0c, // ContainerResources.devices (2, LEN 12)
    0x0a, 0x01, b'r', // ContainerDevices.resource_name (1)
    0x12, 0x01, b'd', // ContainerDevices.device_ids (2)
    0x1a, 0x04, // ContainerDevices.topology (3, LEN 4)
    0x0a, 0x02, // TopologyInfo.nodes (1, LEN 2)
    0x08, 0x01, // NUMANode.ID (1, varint 1)
];

fn list_message() -> ListPodResourcesResponse {
    let mut d = dev("r", &["d"]);
    d.topology = Some(TopologyInfo {
        nodes: vec![NumaNode { id: 1 }],
    });
    ListPodResourcesResponse {
        pod_resources: vec![pod("n", "p", vec![("c", vec![d])])],
    }
}

#[test]
fn list_response_encodes_to_the_v1_field_numbers() {
    assert_eq!(list_message().encode_to_vec(), LIST_BYTES);
}

#[test]
fn list_response_decodes_from_known_bytes() {
    let decoded = ListPodResourcesResponse::decode(LIST_BYTES).unwrap();
    assert_eq!(decoded, list_message());
}

#[test]
fn get_messages_encode_to_the_v1_field_numbers() {
    let req = GetPodResourcesRequest {
        pod_name: "a".into(),
        pod_namespace: "b".into(),
    };
    assert_eq!(req.encode_to_vec(), [0x0a, 0x01, b'a', 0x12, 0x01, b'b']);
    assert_eq!(
        GetPodResourcesRequest::decode(&[0x0a, 0x01, b'a', 0x12, 0x01, b'b'][..]).unwrap(),
        req
    );

    let resp = GetPodResourcesResponse {
        pod_resources: Some(pod("n", "p", vec![])),
    };
    let bytes = [0x0a, 0x06, 0x0a, 0x01, b'p', 0x12, 0x01, b'n'];
    assert_eq!(resp.encode_to_vec(), bytes);
    assert_eq!(GetPodResourcesResponse::decode(&bytes[..]).unwrap(), resp);
    assert!(ListPodResourcesRequest {}.encode_to_vec().is_empty());
}

#[test]
fn fields_plexus_does_not_model_are_skipped_on_decode() {
    // ContainerResources{ name "c", cpu_ids [1,2] (packed), memory [{}] (4), dynamic_resources [{class_name "x"}] (5) }
    let container = [
        0x0a, 0x01, b'c', 0x1a, 0x02, 0x01, 0x02, 0x22, 0x00, 0x2a, 0x03, 0x0a, 0x01, b'x',
    ];
    let decoded = ContainerResources::decode(&container[..]).unwrap();
    assert_eq!(decoded.name, "c");
    assert_eq!(decoded.cpu_ids, vec![1, 2]);
    assert!(decoded.devices.is_empty());
}

#[test]
fn merge_takes_only_the_matching_pod_and_merges_containers_sorted_and_deduplicated() {
    let pods = vec![
        pod(
            "other",
            "web",
            vec![("c", vec![dev("intel.com/vf", &["0000:99:00.1"])])],
        ),
        pod(
            "prod",
            "web",
            vec![
                (
                    "app",
                    vec![
                        dev("intel.com/vf", &["0000:04:00.5", "0000:04:00.2"]),
                        dev("nvidia.com/gpu", &["GPU-1"]),
                        dev("intel.com/empty", &[]),
                    ],
                ),
                (
                    "sidecar",
                    vec![dev("intel.com/vf", &["0000:04:00.3", "0000:04:00.2"])],
                ),
            ],
        ),
        pod(
            "prod",
            "web-2",
            vec![("c", vec![dev("intel.com/vf", &["0000:98:00.1"])])],
        ),
    ];
    let map = merge_devices(&pods, "prod", "web");
    let expected: BTreeMap<String, Vec<String>> = [
        (
            "intel.com/vf".to_string(),
            vec![
                "0000:04:00.2".to_string(),
                "0000:04:00.3".into(),
                "0000:04:00.5".into(),
            ],
        ),
        ("nvidia.com/gpu".to_string(), vec!["GPU-1".to_string()]),
    ]
    .into_iter()
    .collect();
    assert_eq!(map, expected);
    assert!(merge_devices(&pods, "prod", "absent").is_empty());
}

#[tokio::test]
async fn missing_socket_is_no_socket_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let start = Instant::now();
    let err = pod_devices(&socket, "ns", "p", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PodResourcesError::NoSocket(p) if *p == socket),
        "{err:?}"
    );
    assert!(err.is_unavailable());
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn socket_without_listener_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    // Bound, then closed: the socket file stays, connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let err = pod_devices(&socket, "ns", "p", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, PodResourcesError::Connect { .. }), "{err:?}");
    assert!(err.is_unavailable());
    assert!(err.to_string().contains("kubelet.sock"), "{err}");
}

#[tokio::test]
async fn server_that_never_answers_times_out_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    // Accept connections and hold them open without ever speaking HTTP/2.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let bound = Duration::from_millis(300);
    let start = Instant::now();
    let err = pod_devices(&socket, "ns", "p", bound).await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, PodResourcesError::Timeout(d) if d == bound),
        "{err:?}"
    );
    assert!(err.is_unavailable());
    assert!(
        took >= bound && took < bound + Duration::from_secs(1),
        "{took:?}"
    );
    holder.abort();
}

#[test]
fn rpc_errors_are_unavailable_only_for_transport_codes() {
    let rpc = |code| PodResourcesError::Rpc {
        method: proto::LIST_PATH,
        code,
        message: String::new(),
    };
    assert!(rpc(Code::Unavailable).is_unavailable());
    assert!(rpc(Code::DeadlineExceeded).is_unavailable());
    assert!(!rpc(Code::PermissionDenied).is_unavailable());
    assert!(!rpc(Code::Internal).is_unavailable());
}
