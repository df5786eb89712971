//! A cluster of real `nats-server`s with JetStream on loopback, per test: each node is a
//! [`NatsServer`] (own free client port, own store) with a route to every other node
//! (`--cluster`, `--routes`, one `--cluster_name`, a `--server_name` each). The same
//! layout as `deploy/nats-cluster.sh`.

use std::time::{Duration, Instant};

use crate::nats::{free_port, NatsServer};

/// Nodes of one cluster; dropping it kills them all.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `n` (≥ 1) clustered nodes and returns once each accepts clients.
    pub fn start(n: usize) -> NatsCluster {
        NatsCluster::start_with(n, &[])
    }

    /// [`NatsCluster::start`] with `extra` arguments for every node (e.g.
    /// `["--no_advertise=true"]`, as the NATS Helm chart configures its servers).
    pub fn start_with(n: usize, extra: &[&str]) -> NatsCluster {
        assert!(n >= 1, "a cluster needs a node");
        let routes: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let all_routes =
            routes.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        let nodes = routes
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let cluster = format!("nats://127.0.0.1:{port}");
                let name = format!("halyard-n{}", i + 1);
                let mut args = vec![
                    "--server_name",
                    &name,
                    "--cluster_name",
                    "halyard-test",
                    "--cluster",
                    &cluster,
                    "--routes",
                    &all_routes,
                ];
                args.extend_from_slice(extra);
                NatsServer::start_with_args(&args)
            })
            .collect();
        let c = NatsCluster { nodes };
        c.wait_for_routes(Duration::from_secs(30));
        c
    }

    /// Every node's client URL, comma-separated (what `halyard --nats` takes).
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }

    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut NatsServer {
        &mut self.nodes[i]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The last `lines` lines of every node's log, each under its node's name: what a
    /// failing test prints, so that a fault in the cluster (an election, a catch-up) can
    /// be told from one in Halyard.
    pub fn logs(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("----- halyard-n{} -----\n{}", i + 1, n.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until every node logged a route to each other node and JetStream's
    /// meta group has a leader (a node logged the election).
    fn wait_for_routes(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let want = self.nodes.len() - 1;
        loop {
            let logs: Vec<String> = self.nodes.iter().map(|n| n.log_tail(10_000)).collect();
            let routed = logs.iter().all(|l| l.matches("Route connection created").count() >= want);
            let leader = self.nodes.len() == 1
                || logs.iter().any(|l| l.contains("JetStream cluster new metadata leader"));
            if routed && leader {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form in {limit:?}:\n{}",
                logs.join("\n-----\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_broker::BrokerConfig;

    /// Creates Halyard's streams (the meta leader may still be settling: JetStream
    /// answers once it is) and checks that both have 3 replicas.
    async fn assert_streams_have_three_replicas(b: &halyard_broker::Broker) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = halyard_broker::init(b, &Default::default()).await {
            assert!(Instant::now() < deadline, "streams never created: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for name in [halyard_proto::subjects::JOBS_STREAM, halyard_proto::subjects::RESULTS_STREAM]
        {
            let mut s = b.js.get_stream(name).await.unwrap();
            assert_eq!(s.info().await.unwrap().config.num_replicas, 3, "{name}");
        }
    }

    /// Issue 34: a cluster that does not advertise its nodes (the NATS chart's default)
    /// shows a client one node, yet JetStream places 3 replicas: Halyard asks it (a probe
    /// stream) and its streams get 3 without any setting, also for processes probing at
    /// the same moment. A configured number still decides (`--nats-replicas 1`).
    #[test]
    fn no_advertise_still_gets_three_replicas() {
        let cluster = NatsCluster::start_with(3, &["--no_advertise=true"]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let b =
                halyard_broker::connect(&BrokerConfig::new(cluster.node(0).url(), "no-advertise"))
                    .await
                    .unwrap();
            assert_eq!(halyard_broker::cluster_size(&b.client), 1, "nodes hidden by no_advertise");
            assert!(b.client.server_info().cluster.is_some());
            // Processes starting together probe at the same moment, the first ones of the
            // cluster (the probe stream does not exist yet), under one name: each still
            // gets JetStream's answer.
            let mut others = Vec::new();
            for i in 0..4 {
                let cfg = BrokerConfig::new(cluster.node(i % 3).url(), "no-advertise-together");
                others.push(halyard_broker::connect(&cfg).await.unwrap());
            }
            let got =
                futures::future::join_all(others.iter().map(halyard_broker::stream_replicas)).await;
            assert_eq!(got, [3, 3, 3, 3], "probes at the same moment");
            assert_streams_have_three_replicas(&b).await;
            let cfg = BrokerConfig {
                replicas: Some(1),
                ..BrokerConfig::new(cluster.node(1).url(), "no-advertise-r1")
            };
            let b = halyard_broker::connect(&cfg).await.unwrap();
            assert_eq!(halyard_broker::stream_replicas(&b).await, 1);
        });
    }

    /// Halyard sees a 3-node cluster, creates its streams with 3 replicas, and keeps
    /// publishing and reading jobs after the node it was connected to is killed.
    #[test]
    fn streams_get_three_replicas_and_survive_a_node_loss() {
        let mut cluster = NatsCluster::start(3);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // Connected to the first node only; the others come from its INFO.
            let b =
                halyard_broker::connect(&BrokerConfig::new(cluster.node(0).url(), "cluster-test"))
                    .await
                    .unwrap();
            assert_eq!(halyard_broker::cluster_size(&b.client), 3);
            assert_streams_have_three_replicas(&b).await;
            let subject = halyard_proto::subjects::job_subject("p");
            b.js.publish(subject.clone(), "before".into()).await.unwrap().await.unwrap();
        });
        cluster.node_mut(0).stop();
        rt.block_on(async {
            let b = halyard_broker::connect(&BrokerConfig::new(cluster.urls(), "cluster-test-2"))
                .await
                .unwrap();
            let subject = halyard_proto::subjects::job_subject("p");
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match b.js.publish(subject.clone(), "after".into()).await {
                    Ok(ack) => match ack.await {
                        Ok(_) => break,
                        Err(e) => assert!(
                            Instant::now() < deadline,
                            "no publish after the node loss: {e}"
                        ),
                    },
                    Err(e) => {
                        assert!(Instant::now() < deadline, "no publish after the node loss: {e}")
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let mut s = b.js.get_stream(halyard_proto::subjects::JOBS_STREAM).await.unwrap();
            assert_eq!(
                s.info().await.unwrap().state.messages,
                2,
                "a message was lost with the node"
            );
        });
    }
}
