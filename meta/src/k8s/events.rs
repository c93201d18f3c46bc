//! POST one core/v1 Event about the pod (e.g. `AddedInterface`). Callers treat failures as
//! non-fatal.

use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Resource;

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry::{self, RetryPolicy};

/// `source.component` and `reportingComponent` of our events.
pub const EVENT_COMPONENT: &str = "plexus";

/// `action` of our events: every event plexus posts is about a CNI ADD. The apiserver requires
/// `action`, `reportingComponent` and `reportingInstance` on an Event that carries `eventTime`
/// (422 `action: Required value` otherwise).
pub const EVENT_ACTION: &str = "CNIAdd";

/// API limits for core/v1 events that carry `eventTime`.
const MAX_REASON: usize = 128;
const MAX_INSTANCE: usize = 128;
const MAX_MESSAGE: usize = 1024;
const MAX_NAME: usize = 253;

/// The pod an event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub ns: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's node (`spec.nodeName`), when known: the event's `source.host` and
    /// `reportingInstance`, so an admission policy can check that a node reports only as
    /// itself. Empty: the client's `reporting_instance` (the host name).
    pub node: String,
}

/// Event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Cut `s` to at most `max` bytes on a char boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `<pod>.<hex>`, unique per process (nanoseconds, pid, counter), at most 253 bytes.
fn event_name(pod: &str, now: Timestamp) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let suffix = format!(
        "{:x}{:04x}{:02x}",
        now.as_nanosecond(),
        std::process::id() & 0xffff,
        seq & 0xff
    );
    // A cut name must still end with an alphanumeric (DNS-1123 subdomain).
    let pod = truncate(pod, MAX_NAME - 1 - suffix.len()).trim_end_matches(['-', '.']);
    format!("{pod}.{suffix}")
}

/// A non-empty `reportingInstance` of at most 128 bytes.
fn instance_or_default(instance: &str) -> &str {
    match truncate(instance.trim(), MAX_INSTANCE) {
        "" => EVENT_COMPONENT,
        s => s,
    }
}

/// Build the Event object (pure; `now` and `instance` are inputs).
pub fn build_event(
    pod: &PodRef,
    type_: EventType,
    reason: &str,
    message: &str,
    instance: &str,
    now: Timestamp,
) -> Event {
    let instance = if pod.node.is_empty() {
        instance
    } else {
        &pod.node
    };
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&pod.name, now)),
            namespace: Some(pod.ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.ns.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..Default::default()
        },
        type_: Some(type_.as_str().into()),
        reason: Some(truncate(reason, MAX_REASON).into()),
        message: Some(truncate(message, MAX_MESSAGE).into()),
        source: Some(EventSource {
            component: Some(EVENT_COMPONENT.into()),
            host: Some(instance.into()),
        }),
        action: Some(EVENT_ACTION.into()),
        reporting_component: Some(EVENT_COMPONENT.into()),
        reporting_instance: Some(instance_or_default(instance).into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        ..Default::default()
    }
}

impl KubeClient {
    /// POST one Event about `pod` (a single attempt, no retry).
    pub async fn post_event(
        &self,
        pod: &PodRef,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), K8sError> {
        let _phase = plexus_delegates::timing::phase("event");
        let event = build_event(
            pod,
            type_,
            reason,
            message,
            &self.opts.reporting_instance,
            Timestamp::now(),
        );
        let ctx = Ctx {
            what: "post event",
            ns: &pod.ns,
            name: &pod.name,
        };
        // The created Event is not read back (its deserializer would only add code).
        K8sError::check_names(ctx)?;
        let url = Event::url_path(&(), Some(&segment(&pod.ns)));
        let body = serde_json::to_vec(&event).map_err(|e| K8sError::Client(e.to_string()))?;
        retry::run(
            RetryPolicy::none(),
            self.opts.request_timeout,
            ctx,
            || async {
                let req =
                    kube::core::Request::new(&url).create(&PostParams::default(), body.clone());
                self.exchange(ctx, built(ctx, req)?).await
            },
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{json_response, MockApi};
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            ns: "ns1".into(),
            name: "p1".into(),
            uid: "u1".into(),
            node: String::new(),
        }
    }

    #[test]
    fn a_known_node_is_the_reporting_instance() {
        let on_node = PodRef {
            node: "worker-7".into(),
            ..pod()
        };
        let e = build_event(
            &on_node,
            EventType::Normal,
            "r",
            "m",
            "host-a",
            Timestamp::now(),
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("worker-7"));
        assert_eq!(e.source.unwrap().host.as_deref(), Some("worker-7"));
        let e = build_event(
            &pod(),
            EventType::Normal,
            "r",
            "m",
            "host-a",
            Timestamp::now(),
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("host-a"));
    }

    #[tokio::test]
    async fn posts_one_event_with_expected_shape() {
        let mock = MockApi::new(vec![json_response(
            201,
            r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"p1.x"},"involvedObject":{}}"#,
        )]);
        mock.client()
            .post_event(
                &pod(),
                EventType::Normal,
                "AddedInterface",
                "Add net1 [10.1.1.2/24] from ns1/macvlan",
            )
            .await
            .unwrap();
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 1);
        let r = &reqs[0];
        assert_eq!(r.method, "POST");
        assert_eq!(r.path_and_query, "/api/v1/namespaces/ns1/events?");
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        let v = r.json();
        assert_eq!(v["kind"], "Event");
        assert_eq!(v["type"], "Normal");
        assert_eq!(v["reason"], "AddedInterface");
        assert_eq!(v["count"], 1);
        assert_eq!(v["source"]["component"], "plexus");
        assert_eq!(v["reportingComponent"], "plexus");
        // Required by the apiserver on an event with eventTime (issue 7: 422 without it).
        assert_eq!(v["action"], EVENT_ACTION);
        assert!(v["reportingInstance"]
            .as_str()
            .is_some_and(|s| !s.is_empty()));
        assert_eq!(
            v["involvedObject"],
            serde_json::json!({"apiVersion":"v1","kind":"Pod","namespace":"ns1","name":"p1","uid":"u1"})
        );
        assert!(v["metadata"]["name"].as_str().unwrap().starts_with("p1."));
        assert_eq!(v["firstTimestamp"], v["lastTimestamp"]);
        assert!(v["eventTime"].as_str().is_some());
    }

    #[tokio::test]
    async fn event_errors_are_returned_once() {
        let mock = MockApi::repeating(json_response(
            503,
            r#"{"kind":"Status","code":503,"message":"x"}"#,
        ));
        let err = mock
            .client()
            .post_event(&pod(), EventType::Warning, "Failed", "boom")
            .await
            .unwrap_err();
        assert!(err.is_transient());
        assert_eq!(mock.requests().len(), 1);
    }

    #[test]
    fn names_are_unique_and_bounded_and_text_truncated() {
        let now = Timestamp::now();
        assert_ne!(event_name("p", now), event_name("p", now));
        let long = "a".repeat(300);
        assert!(event_name(&long, now).len() <= MAX_NAME);
        let e = build_event(
            &pod(),
            EventType::Warning,
            &"r".repeat(200),
            &"é".repeat(1000),
            "n1",
            now,
        );
        assert_eq!(e.reason.unwrap().len(), MAX_REASON);
        let m = e.message.unwrap();
        assert!(m.len() <= MAX_MESSAGE && m.len() >= MAX_MESSAGE - 1);
        assert_eq!(e.type_.as_deref(), Some("Warning"));
    }

    #[test]
    fn new_style_fields_are_always_set_and_names_stay_dns_subdomains() {
        let now = Timestamp::now();
        for instance in ["", "  ", &"n".repeat(300)] {
            let e = build_event(&pod(), EventType::Normal, "r", "m", instance, now);
            let inst = e.reporting_instance.unwrap();
            assert!(!inst.is_empty() && inst.len() <= MAX_INSTANCE, "{inst:?}");
            assert_eq!(e.action.as_deref(), Some(EVENT_ACTION));
            assert!(e.event_time.is_some());
        }
        // Wherever the cut falls, the kept part of the pod name ends with an alphanumeric.
        for k in 200..253 {
            let long = format!("{}-.{}", "a".repeat(k), "b".repeat(40));
            let name = event_name(&long, now);
            let (pod, _) = name.rsplit_once('.').unwrap();
            assert!(name.len() <= MAX_NAME, "{name}");
            assert!(pod.ends_with(|c: char| c.is_ascii_alphanumeric()), "{name}");
        }
    }
}
