//! The HTTP server: `/metrics`, `/healthz` and `/livez` (liveness: the member Lease loop and
//! the shard agent make progress), `/readyz`
//! (ready once the KCP caches have synced, and only while the member Lease is fresh).

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::health::Heartbeat;
use crate::metrics::Metrics;
use crate::sharding::ShardView;
use crate::sharding::agent::ShardsDebug;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct HttpState {
    /// Metrics to render.
    pub metrics: Metrics,
    /// Whether the replica is ready.
    pub ready: watch::Receiver<bool>,
    /// The shard view.
    pub shards: watch::Receiver<ShardsDebug>,
    /// The ownership gate: a fenced replica is not ready.
    pub view: ShardView,
    /// The loops whose progress liveness requires.
    pub heartbeats: Vec<Heartbeat>,
}

/// The router; tested without binding a port.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(livez))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/debug/shards", get(debug_shards))
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

async fn debug_shards(State(state): State<HttpState>) -> impl IntoResponse {
    axum::Json(state.shards.borrow().clone())
}

async fn livez(State(state): State<HttpState>) -> impl IntoResponse {
    match state.heartbeats.iter().find(|h| h.is_stale()) {
        Some(h) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the {} loop made no progress for {:.0}s", h.name(), h.silence().as_secs_f64()),
        ),
        None => (StatusCode::OK, "ok".to_owned()),
    }
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if !*state.ready.borrow() {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the KCP caches to sync")
    } else if state.view.is_fenced() {
        (StatusCode::SERVICE_UNAVAILABLE, "fenced: the member Lease was not renewed within the renew deadline")
    } else {
        (StatusCode::OK, "ready")
    }
}

/// Serves until `shutdown` resolves.
///
/// # Errors
/// Fails when the address cannot be bound or the server fails.
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "Serving metrics and health");
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn get_status(router: Router, path: &str) -> (StatusCode, String) {
        let resp = router.oneshot(Request::get(path).body(Body::empty()).expect("request")).await.expect("response");
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readiness_follows_the_cache_state() {
        let metrics = Metrics::new().expect("metrics");
        let (tx, rx) = watch::channel(false);
        let (_shards_tx, shards) = watch::channel(ShardsDebug::default());
        let view = ShardView::new(4);
        let agent = Heartbeat::new("agent", std::time::Duration::from_secs(30));
        let r = router(HttpState { metrics, ready: rx, shards, view: view.clone(), heartbeats: vec![agent.clone()] });
        assert_eq!(get_status(r.clone(), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get_status(r.clone(), "/healthz").await.0, StatusCode::OK);
        tx.send_replace(true);
        let (status, body) = get_status(r.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "fenced before the first renewal: {body}");
        view.renewed(tokio::time::Instant::now(), std::time::Duration::from_secs(10));
        assert_eq!(get_status(r.clone(), "/readyz").await.0, StatusCode::OK);
        let (status, body) = get_status(r.clone(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("catalogsync_syncs_in_flight"), "{body}");
        let (status, body) = get_status(r, "/debug/shards").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\"rows\""), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_fails_when_a_loop_stops_beating() {
        let (_tx, ready) = watch::channel(true);
        let (_shards_tx, shards) = watch::channel(ShardsDebug::default());
        let agent = Heartbeat::new("agent", std::time::Duration::from_secs(30));
        let state = HttpState {
            metrics: Metrics::new().expect("metrics"),
            ready,
            shards,
            view: ShardView::new(1),
            heartbeats: vec![agent.clone()],
        };
        let r = router(state);
        assert_eq!(get_status(r.clone(), "/livez").await.0, StatusCode::OK);
        tokio::time::advance(std::time::Duration::from_secs(31)).await;
        let (status, body) = get_status(r.clone(), "/healthz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "the agent loop made no progress for 31s");
        agent.beat();
        assert_eq!(get_status(r, "/livez").await.0, StatusCode::OK);
    }
}
