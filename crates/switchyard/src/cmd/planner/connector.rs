//! What carries out the planner's replica counts: nothing (`noop`), local worker
//! processes, or Kubernetes Deployments (with the `kubernetes` feature).

#[cfg(feature = "kubernetes")]
use std::collections::BTreeMap;

#[cfg(feature = "kubernetes")]
use anyhow::Context;
use anyhow::{Result, bail};
use switchyard_core::WorkerRole;

use super::PlannerArgs;
use super::local::LocalWorkers;

pub(super) enum Connector {
    Noop,
    Local(LocalWorkers),
    /// A Deployment per role.
    #[cfg(feature = "kubernetes")]
    Kubernetes(BTreeMap<WorkerRole, switchyard::kubernetes::DeploymentScaler>),
}

impl Connector {
    pub(super) async fn scale_to(&mut self, role: WorkerRole, replicas: u32) -> Result<()> {
        match self {
            Connector::Noop => Ok(()),
            Connector::Local(local) => local.scale_to(role, replicas),
            #[cfg(feature = "kubernetes")]
            Connector::Kubernetes(scalers) => match scalers.get_mut(&role) {
                Some(scaler) => Ok(scaler.scale_to(replicas).await?),
                None => bail!("no Deployment of {role} workers to scale"),
            },
        }
    }
}

#[cfg(feature = "kubernetes")]
pub(super) async fn kubernetes(args: &PlannerArgs) -> Result<Connector> {
    let deployments: Vec<(WorkerRole, &String)> = if args.disagg {
        match (&args.k8s_prefill_deployment, &args.k8s_decode_deployment) {
            (Some(p), Some(d)) => vec![(WorkerRole::Prefill, p), (WorkerRole::Decode, d)],
            _ => bail!(
                "with --disagg the kubernetes connector scales the Deployments named by \
                 --k8s-prefill-deployment and --k8s-decode-deployment"
            ),
        }
    } else {
        let Some(deployment) = &args.k8s_deployment else {
            bail!("the kubernetes connector scales the Deployment named by --k8s-deployment");
        };
        vec![(WorkerRole::Aggregated, deployment)]
    };
    let mut scalers = BTreeMap::new();
    for (role, deployment) in deployments {
        let scaler = switchyard::kubernetes::DeploymentScaler::from_environment(
            &args.k8s_namespace,
            deployment,
        )
        .await
        .context("no Kubernetes credentials (in-cluster service account or kubeconfig)")?;
        scalers.insert(role, scaler);
    }
    Ok(Connector::Kubernetes(scalers))
}

#[cfg(not(feature = "kubernetes"))]
pub(super) async fn kubernetes(_: &PlannerArgs) -> Result<Connector> {
    bail!(
        "this switchyard was built without the kubernetes connector: cargo build --features kubernetes"
    )
}
