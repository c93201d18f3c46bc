//! Test-only mock API server, for the `k8s` tests and the crate's other API tests (inputs, daemon
//! caches): a `tower::Service` that records requests and answers from a handler.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use kube::client::Body;

use super::client::{ClientOptions, KubeClient};
use super::transport::{Request, SendFuture, Transport};

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub content_type: Option<String>,
    pub body: String,
}

impl Recorded {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

/// A canned answer.
#[derive(Clone, Debug)]
pub struct Canned {
    pub status: u16,
    pub body: String,
}

/// A JSON answer with `status`.
pub fn json_response(status: u16, body: &str) -> Canned {
    Canned {
        status,
        body: body.to_owned(),
    }
}

/// Decides the answer to a request; `None` means never answer.
type Handler = dyn Fn(&Recorded) -> Option<Canned> + Send + Sync;

/// The mock: shared record of requests plus the handler.
#[derive(Clone)]
pub struct MockApi {
    requests: Arc<Mutex<Vec<Recorded>>>,
    handler: Arc<Handler>,
    hold_until: usize,
}

impl MockApi {
    /// Answer from `handler`.
    pub fn with_handler(
        handler: impl Fn(&Recorded) -> Option<Canned> + Send + Sync + 'static,
    ) -> Self {
        MockApi {
            requests: Arc::default(),
            handler: Arc::new(handler),
            hold_until: 0,
        }
    }

    /// Hold every answer until `n` requests have arrived (at most 2 s): proves concurrency.
    pub fn hold_until(mut self, n: usize) -> Self {
        self.hold_until = n;
        self
    }

    /// Answer with `answers` in order, then 500.
    pub fn new(answers: Vec<Canned>) -> Self {
        let queue = Mutex::new(VecDeque::from(answers));
        Self::with_handler(move |_| {
            Some(
                queue.lock().unwrap().pop_front().unwrap_or_else(|| {
                    json_response(500, r#"{"message":"mock: no more answers"}"#)
                }),
            )
        })
    }

    /// Always answer `answer`.
    pub fn repeating(answer: Canned) -> Self {
        Self::with_handler(move |_| Some(answer.clone()))
    }

    /// Never answer.
    pub fn hanging() -> Self {
        Self::with_handler(|_| None)
    }

    /// Requests seen so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// A `KubeClient` talking to this mock, default options.
    pub fn client(&self) -> KubeClient {
        self.client_with(ClientOptions::default())
    }

    /// A `KubeClient` talking to this mock through the [`Transport`] seam (as the thin
    /// plugin's client does), with a `kube::Client` over the same mock for watches.
    pub fn client_with(&self, opts: ClientOptions) -> KubeClient {
        KubeClient::with_transport(Arc::new(self.clone()), opts)
    }

    /// Record `rec`, then answer it (`None`: never).
    async fn answer(&self, rec: Recorded) -> Option<Canned> {
        self.requests.lock().unwrap().push(rec.clone());
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.requests.lock().unwrap().len() < self.hold_until
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        (self.handler)(&rec)
    }
}

fn recorded(parts: &http::request::Parts, body: &[u8]) -> Recorded {
    Recorded {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: String::from_utf8_lossy(body).into_owned(),
    }
}

impl Transport for MockApi {
    fn send(&self, req: Request) -> SendFuture<'_> {
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let Some(answer) = self.answer(recorded(&parts, &body)).await else {
                return std::future::pending().await;
            };
            let mut response = http::Response::new(answer.body.into_bytes());
            *response.status_mut() = http::StatusCode::from_u16(answer.status).unwrap();
            Ok(response)
        })
    }

    fn kube_client(&self) -> Option<kube::Client> {
        Some(kube::Client::new(self.clone(), "default"))
    }
}

impl tower::Service<http::Request<Body>> for MockApi {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let Some(answer) = this.answer(recorded(&parts, &bytes)).await else {
                return std::future::pending().await;
            };
            Ok(http::Response::builder()
                .status(answer.status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(answer.body.into_bytes()))?)
        })
    }
}
