//! The bus amd-gpud is on, and why a session with it ended: the leaf the
//! rest of [`gpud`](super) builds on.

use std::time::Duration;

use ipc::proxy::NodeProxy;
use zbus::{Connection, proxy::CacheProperties};

/// Where amd-gpud is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bus {
    System,
    Address(String),
}

/// Why a session with amd-gpud ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("cannot connect to the bus: {0}")]
    Connect(#[source] zbus::Error),
    #[error("D-Bus error: {0}")]
    Bus(#[from] zbus::Error),
    #[error("amd-gpud answered badly: {0}")]
    Api(#[from] ipc::ApiError),
    #[error("lost the connection to the bus")]
    BusLost,
    #[error("amd-gpud did not answer within {0:?}")]
    Timeout(Duration),
}

/// A connection to the bus amd-gpud is on.
///
/// # Errors
/// When the bus cannot be reached.
pub(crate) async fn connect(bus: &Bus) -> Result<Connection, SessionError> {
    let built = match bus {
        Bus::System => Connection::system().await,
        Bus::Address(address) => {
            zbus::connection::Builder::address(address.as_str())
                .map_err(SessionError::Connect)?
                .build()
                .await
        }
    };
    built.map_err(SessionError::Connect)
}

/// amd-gpud's Node interface on `conn`, caching no property, so that each
/// read is amd-gpud's answer now.
///
/// # Errors
/// When the proxy cannot be built on the connection.
pub(crate) async fn node_proxy(conn: &Connection) -> Result<NodeProxy<'_>, SessionError> {
    Ok(NodeProxy::builder(conn)
        .cache_properties(CacheProperties::No)
        .build()
        .await?)
}
