//! `recollect serve`: both roles of the API (store and recall) over the embedded app, on the
//! serving layer the distributed gateway and query services share (`recollect_serve`).

use std::sync::Arc;

use recollect_api::Auth;
use recollect_gateway::http::GatewayState;
use recollect_query::QueryState;
use recollect_runtime::{graph_check, vectors_check, Check};
use recollect_serve::Roles;

use crate::app::App;

/// Both roles over the one embedded app.
pub fn roles(app: &App) -> Roles {
    let auth = Auth::new(app.settings.api_keys());
    Roles {
        gateway: Some(Arc::new(GatewayState {
            gateway: app.gateway.clone(),
            eraser: app.eraser.clone(),
            auth: auth.clone(),
            backup: Some(app.backup.clone()),
            admin_key: app.settings.server.admin_key.clone(),
        })),
        query: Some(Arc::new(QueryState {
            recall: app.recall.clone(),
            auth,
            raw: Some(app.raw.clone()),
        })),
    }
}

/// Ready only when every store answers: the raw store, the graph and the vectors.
fn checks(app: &App) -> Vec<(&'static str, Check)> {
    let raw = app.raw.clone();
    let raw_check: Check = Arc::new(move || {
        let raw = raw.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || raw.count().is_ok())
                .await
                .unwrap_or(false)
        })
    });
    vec![
        ("raw store", raw_check),
        graph_check(app.graph.clone()),
        vectors_check(app.vectors.clone()),
    ]
}

pub async fn serve(app: App) -> anyhow::Result<()> {
    tracing::info!(data_dir = %app.settings.storage.data_dir.display(), "recollect serving");
    recollect_serve::serve(&app.settings, roles(&app), checks(&app)).await?;
    app.shutdown().await;
    Ok(())
}
