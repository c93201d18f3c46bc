//! Tests of the test API server through the real kube client over HTTP.
