//! The planner's Kubernetes connector: a replica count becomes a merge PATCH of a
//! Deployment's scale subresource (`spec.replicas`), as `kubectl scale` sends. Kubernetes
//! then starts pods or terminates them (SIGTERM: a worker drains), and the planner sees the
//! result in the fleet it watches.

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// A refusal or a failure to reach the API server, with what it was about.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error(
        "Kubernetes refused to scale deployment {target} to {replicas}: {reason} ({code}): {message}"
    )]
    Refused {
        target: String,
        replicas: u32,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("cannot scale deployment {target} to {replicas}: {source}")]
    Failed {
        target: String,
        replicas: u32,
        #[source]
        source: kube::Error,
    },
}

/// Scales one Deployment.
#[derive(Clone)]
pub struct DeploymentScaler {
    api: Api<Deployment>,
    namespace: String,
    deployment: String,
}

impl std::fmt::Debug for DeploymentScaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeploymentScaler({}/{})",
            self.namespace, self.deployment
        )
    }
}

impl DeploymentScaler {
    pub fn new(client: Client, namespace: &str, deployment: &str) -> Self {
        DeploymentScaler {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            deployment: deployment.to_string(),
        }
    }

    /// With the credentials of the environment: the pod's service account in a cluster,
    /// else the kubeconfig.
    pub async fn from_environment(namespace: &str, deployment: &str) -> Result<Self, kube::Error> {
        Ok(Self::new(
            Client::try_default().await?,
            namespace,
            deployment,
        ))
    }

    pub async fn scale_to(&self, replicas: u32) -> Result<(), ScaleError> {
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        let target = format!("{}/{}", self.namespace, self.deployment);
        match self
            .api
            .patch_scale(
                &self.deployment,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err(ScaleError::Refused {
                target,
                replicas,
                code: status.code,
                reason: status.reason.to_string(),
                message: status.message.to_string(),
            }),
            Err(source) => Err(ScaleError::Failed {
                target,
                replicas,
                source,
            }),
        }
    }
}
