//! `switchyard-vtep-sync`: keeps the node's overlays joined to the other
//! nodes of the cluster (see the library's documentation).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use switchyard_api::overlay::NodeIpam;
use switchyard_api::{Client, Request};
use switchyard_vtep_sync::nodes::{AddressFamily, AddressType, Nodes, VTEP_ANNOTATION};
use switchyard_vtep_sync::plan::{self, plan};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, Instant};
use tracing::{info, warn};

/// Joins the switch's overlays to the other nodes of the cluster (their
/// addresses as remote VTEPs), watching the Nodes.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The switch's control socket.
    #[arg(long, default_value = "/run/switchyard/control.sock")]
    control_socket: PathBuf,
    /// This node's name (in a pod, the downward API's `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The nodes that run Switchyard, as a label selector (`key=value`,
    /// comma-separated): match the DaemonSet's nodeSelector. Empty: every
    /// node.
    #[arg(long, default_value = "")]
    selector: String,
    /// Which of a node's addresses is its VTEP: InternalIP or ExternalIP.
    #[arg(long, default_value = "InternalIP")]
    address_type: AddressType,
    /// The VTEP's address family, the same on every node: prefer-ipv4
    /// (IPv4 where a node has it, else IPv6), ipv4 or ipv6.
    #[arg(long, default_value = "prefer-ipv4")]
    address_family: AddressFamily,
    /// An overlay to fill (repeat for more). None: every overlay of the
    /// switch's config.
    #[arg(long = "overlay")]
    overlays: Vec<String>,
    /// How often the switch's VTEPs are checked against the nodes when
    /// nothing changed, in seconds (the switch may have been restarted
    /// with another config).
    #[arg(long, default_value_t = 60)]
    resync_secs: u64,
    /// The namespace of the Leases that claim this node's slices of the
    /// overlays' addresses (in a pod, the downward API's
    /// `metadata.namespace`); unset: the client's default namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// Enforce MultiNetworkPolicy on this node's ports: watch the
    /// policies, pods and namespaces (list and watch only) and give each
    /// port the rules of the policies that select its pod.
    #[arg(long)]
    policy: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    anyhow::ensure!(
        !args.node_name.is_empty(),
        "--node-name (NODE_NAME) is empty"
    );
    anyhow::ensure!(args.resync_secs > 0, "--resync-secs: 0");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// Retries of a sync that failed (the switch restarting, a node it has no
/// route to): from 1 s, doubling, up to the resync interval.
const FIRST_RETRY: Duration = Duration::from_secs(1);

async fn run(args: Args) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // In a pod: the service account; elsewhere: $KUBECONFIG.
    let client = kube::Client::try_default()
        .await
        .context("Kubernetes API client")?;
    let mut config = watcher::Config::default();
    if !args.selector.is_empty() {
        config = config.labels(&args.selector);
    }
    // List, then watch from the list's resourceVersion; relist when the
    // watch falls too far behind (410 Gone); back off on errors.
    let namespace = args
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api = Api::<Node>::all(client);
    let stream = watcher::watcher(api.clone(), config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut term = signal(SignalKind::terminate())?;
    let resync = Duration::from_secs(args.resync_secs);
    let mut claims = claims::Claims::new(
        Api::namespaced(api.clone().into_client(), &namespace),
        &namespace,
        &args.node_name,
        resync,
    );
    let mut nodes = Nodes::new(&args.node_name, args.address_type, args.address_family);
    let mut listing: Option<Nodes> = None;
    let mut listed = false;
    let mut dirty = false;
    let mut next_check = Instant::now() + resync;
    let mut retry = FIRST_RETRY;
    let mut last = Outcome::default();
    let mut sent: Option<(IpAddr, Option<IpAddr>)> = None;
    info!(node = %args.node_name, selector = %args.selector, "watching the nodes");
    // The watches of the pods (and of what policy and the stations need):
    // from the start with --policy, else once the switch has overlays.
    let (joined_tx, joined_rx) = tokio::sync::watch::channel(cluster::Joined {
        listed: Instant::now(),
        overlays: BTreeMap::new(),
        vteps: BTreeMap::new(),
        stations: BTreeMap::new(),
    });
    let mut joined_rx = Some(joined_rx);
    let spawn_cluster = |rx| {
        let (c, socket) = (api.clone().into_client(), args.control_socket.clone());
        let policy = args.policy;
        tokio::spawn(async move {
            if let Err(e) = cluster::run(c, socket, resync, policy, rx).await {
                // The node's VTEPs are kept all the same; the process
                // exits so that the kubelet restarts it and it is seen.
                tracing::error!("watches of the cluster: {e:#}");
                std::process::exit(1);
            }
        });
    };
    if args.policy {
        spawn_cluster(joined_rx.take().expect("not taken yet"));
    }
    loop {
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(Event::Init)) => listing = Some(Nodes::new(&args.node_name, args.address_type, args.address_family)),
                Some(Ok(Event::InitApply(n))) => {
                    if let Some(l) = listing.as_mut() {
                        l.apply(&n);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    if let Some(l) = listing.take() {
                        nodes = l;
                    }
                    info!(nodes = nodes.len(), "listed the nodes");
                    listed = true;
                    dirty = true;
                }
                Some(Ok(Event::Apply(n))) => {
                    nodes.apply(&n);
                    dirty = true;
                }
                Some(Ok(Event::Delete(n))) => {
                    nodes.delete(&n);
                    dirty = true;
                }
                Some(Err(e)) => warn!("watching the nodes: {e}"),
                None => anyhow::bail!("the watch of the nodes ended"),
            },
            _ = sleep_until(next_check) => dirty = true,
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
        if !(dirty && listed) {
            continue;
        }
        let remotes = nodes.remotes();
        let own = nodes.own_vtep();
        // What this node published, with what the watch showed of its
        // annotation then: not sent again until the watch shows the
        // annotation changed (to it, or to anything else, which is put
        // right as before), however many other events or resyncs come
        // first.
        if sent.is_some_and(|(_, then)| nodes.own_published() != then) {
            sent = None;
        }
        let waiting = sent.map(|(a, _)| a);
        let published =
            match own.filter(|a| nodes.own_published() != Some(*a) && waiting != Some(*a)) {
                Some(a) => {
                    let r = publish(&api, &args.node_name, a).await;
                    if r.is_ok() {
                        sent = Some((a, nodes.own_published()));
                    }
                    r
                }
                None => Ok(()),
            };
        // The tunnels leave from this node's VTEP address where it is one
        // of the host's (the pod shares the host's network); else (an
        // address the node is reached at through NAT) from the route's.
        let local = own.filter(|a| is_host_address(*a));
        let socket = args.control_socket.clone();
        let wanted = args.overlays.clone();
        let vteps = remotes.iter().map(|(a, n)| (n.clone(), *a)).collect();
        let mut outcome =
            tokio::task::spawn_blocking(move || sync(&socket, &wanted, &remotes, local))
                .await
                .context("the sync task")?;
        // The switch's VTEPs, for the stations.
        if let Some((listed, overlays, stations)) = outcome.joined.take() {
            if !overlays.is_empty() {
                if let Some(rx) = joined_rx.take() {
                    spawn_cluster(rx);
                }
            }
            joined_tx.send_replace(cluster::Joined {
                listed,
                overlays,
                vteps,
                stations,
            });
        }
        // The node's slices of the overlays' addresses: once the switch
        // answered (it says which overlays split theirs), whatever became
        // of the VTEPs.
        if let Some(ipams) = &outcome.ipams {
            if let Err(e) = claims
                .pass(nodes.own_uid(), ipams, &args.control_socket)
                .await
            {
                warn!("{e:#}");
                outcome.error.get_or_insert(e);
            }
        }
        if let Err(e) = published {
            warn!("{e:#}");
            outcome.error.get_or_insert(e);
        }
        if outcome.overlays != last.overlays && outcome.error.is_none() {
            if outcome.overlays.is_empty() {
                info!("the switch has no overlays: none to fill");
            } else {
                info!(overlays = ?outcome.overlays, "filling the overlays");
            }
        }
        if let Some(e) = &outcome.error {
            warn!("will retry in {retry:?}: {e:#}");
            next_check = Instant::now() + retry;
            retry = (retry * 2).min(resync);
        } else {
            next_check = Instant::now() + resync;
            retry = FIRST_RETRY;
        }
        dirty = false;
        last = outcome;
    }
    // The switch keeps its VTEPs (they are persisted): a sync that stops,
    // for an upgrade, leaves the overlays as they are.
    info!("stopping");
    Ok(())
}

/// What the agent watches of the cluster besides the Nodes (pods, and as
/// needed NADs, namespaces and MultiNetworkPolicies), and what it does
/// with them: the overlays' stations, and MultiNetworkPolicy on this
/// node's ports.
mod cluster {
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use std::path::{Path, PathBuf};
    use std::pin::Pin;
    use std::time::Duration;

    use futures::{Stream, StreamExt};
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::runtime::watcher::{self, Event};
    use kube::runtime::WatchStreamExt;
    use kube::Api;
    use switchyard_api::{Client, Request};
    use switchyard_vtep_sync::policy::{self, PodView, PolicyView};
    use switchyard_vtep_sync::stations::{self, Network, Stations};
    use tokio::sync::watch;
    use tokio::time::{sleep_until, Instant};
    use tracing::{debug, info, warn};

    /// How long the ports and stations wait after a change for the
    /// changes that come with it (a policy and its pods, a pod's status
    /// and its network-status): well inside the second an update must
    /// take effect in.
    const SETTLE: Duration = Duration::from_millis(100);

    /// How often the switch's ports are looked at for ports made since
    /// the last pass (a pod's port made again, say): a port of a known
    /// pod gets its policy within this.
    const POLL: Duration = Duration::from_secs(2);

    /// What the node loop last found of the switch's overlays, for the
    /// stations: which overlays it fills, which node each remote VTEP is,
    /// and which VTEPs the switch has with how many stations.
    #[derive(Debug, Clone)]
    pub struct Joined {
        /// When the switch's VTEPs were listed.
        pub listed: Instant,
        /// The overlays filled, each with the VLANs it carries across
        /// (empty: an untagged overlay).
        pub overlays: BTreeMap<String, Vec<u16>>,
        /// Each remote node's VTEP address.
        pub vteps: BTreeMap<String, IpAddr>,
        /// The switch's VTEPs (overlay, address) and how many stations
        /// each has.
        pub stations: BTreeMap<(String, IpAddr), usize>,
    }

    /// What the watches show.
    #[derive(Default)]
    struct World {
        pods: BTreeMap<(String, String), PodView>,
        namespaces: BTreeMap<String, BTreeMap<String, String>>,
        policies: BTreeMap<(String, String), PolicyView>,
        /// Each NAD (`namespace/name`), with the overlay network it is
        /// (`None`: another kind of network).
        nads: BTreeMap<String, Option<Network>>,
        /// Changes applied so far.
        generation: u64,
    }

    /// What a pass computes the ports' policies from.
    struct Snapshot {
        generation: u64,
        pods: Vec<PodView>,
        namespaces: BTreeMap<String, BTreeMap<String, String>>,
        policies: Vec<PolicyView>,
    }

    impl World {
        fn snapshot(&self) -> Snapshot {
            Snapshot {
                generation: self.generation,
                pods: self.pods.values().cloned().collect(),
                namespaces: self.namespaces.clone(),
                policies: self.policies.values().cloned().collect(),
            }
        }

        /// The stations `joined`'s overlays and remote nodes have.
        fn stations(&self, joined: &Joined) -> Stations {
            let networks: BTreeMap<String, Network> = self
                .nads
                .iter()
                .filter_map(|(k, n)| Some((k.clone(), n.clone()?)))
                .collect();
            stations::stations(
                &joined.overlays,
                &joined.vteps,
                self.pods.values(),
                &networks,
            )
        }
    }

    fn key(m: &kube::core::ObjectMeta) -> (String, String) {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    }

    /// One watch event of any of the four kinds; the `Init*` events of a
    /// re-list replace that kind's objects once it is done.
    enum Change {
        Pod(Box<Event<Pod>>),
        Namespace(Event<Namespace>),
        Policy(Event<DynamicObject>),
        Nad(Event<DynamicObject>),
    }

    /// The kinds, as `listed` indexes them.
    const PODS: usize = 0;
    const NAMESPACES: usize = 1;
    const POLICIES: usize = 2;
    const NADS: usize = 3;

    type Changes = Pin<Box<dyn Stream<Item = Result<Change, watcher::Error>> + Send>>;

    /// The watch of a dynamic resource (`group/version`, `kind`,
    /// `plural`), every namespace.
    fn dynamic_watch(
        client: &kube::Client,
        (group, version, kind, plural): (&str, &str, &str, &str),
        change: fn(Event<DynamicObject>) -> Change,
    ) -> Changes {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        Box::pin(
            watcher::watcher(
                Api::<DynamicObject>::all_with(client.clone(), &ar),
                watcher::Config::default(),
            )
            .default_backoff()
            .map(move |e| e.map(change)),
        )
    }

    /// Watches the pods, and with `policy` the namespaces and
    /// MultiNetworkPolicies (whose rules it gives this node's ports), and
    /// once `joined` has overlays the NADs (and sets the stations of each
    /// remote VTEP). Runs until the watches end.
    pub async fn run(
        client: kube::Client,
        socket: PathBuf,
        resync: Duration,
        policy: bool,
        mut joined: watch::Receiver<Joined>,
    ) -> anyhow::Result<()> {
        let cfg = watcher::Config::default;
        let mut watches: Vec<Changes> = vec![Box::pin(
            watcher::watcher(Api::<Pod>::all(client.clone()), cfg())
                .default_backoff()
                .map(|e| e.map(|e| Change::Pod(Box::new(e)))),
        )];
        if policy {
            watches.push(Box::pin(
                watcher::watcher(Api::<Namespace>::all(client.clone()), cfg())
                    .default_backoff()
                    .map(|e| e.map(Change::Namespace)),
            ));
            watches.push(dynamic_watch(
                &client,
                (
                    "k8s.cni.cncf.io",
                    "v1beta1",
                    "MultiNetworkPolicy",
                    "multi-networkpolicies",
                ),
                Change::Policy,
            ));
            info!("watching MultiNetworkPolicies, pods and namespaces");
        }
        let mut all = futures::stream::select_all(watches);
        let mut world = World::default();
        // Each kind's objects while it is listed again.
        let mut relist = World::default();
        let mut listed = [false; 4];
        let policy_ready = |l: &[bool; 4]| policy && l[PODS] && l[NAMESPACES] && l[POLICIES];
        let stations_ready = |l: &[bool; 4]| l[PODS] && l[NADS];
        // A policy pass is due after a change (once it settled) and every
        // POLL, for ports made meanwhile and ports that failed (each
        // backing off, up to the resync interval); a stations pass after a
        // change, and when one failed.
        let mut due: Option<Instant> = None;
        let mut stations_due: Option<Instant> = None;
        // After a refusal, no stations pass before this (whatever changes).
        let mut stations_not_before = Instant::now();
        let mut next_poll = Instant::now() + POLL;
        let mut enforcer = Some(Enforcer::new(resync));
        let mut stationer = Some(Stationer::new(resync));
        let mut nads_watched = false;
        // What the last pass computed from, kept while nothing changes.
        let mut snap: Option<std::sync::Arc<Snapshot>> = None;
        let far = || Instant::now() + Duration::from_secs(3600);
        loop {
            let wake = due
                .unwrap_or(next_poll)
                .min(next_poll)
                .min(stations_due.unwrap_or_else(far));
            tokio::select! {
                ev = all.next() => {
                    let Some(ev) = ev else { anyhow::bail!("the watches ended") };
                    let ev = match ev {
                        Ok(ev) => ev,
                        Err(e) => {
                            warn!("watches of the cluster: {e}");
                            continue;
                        }
                    };
                    // A NAD says nothing policy reads: its ports' policies
                    // are not computed again for it.
                    let policy_news = !matches!(ev, Change::Nad(_));
                    apply(&mut world, &mut relist, &mut listed, ev);
                    let settled = Instant::now() + SETTLE;
                    if policy_news {
                        world.generation += 1;
                        if policy_ready(&listed) {
                            due = Some(due.map_or(settled, |d| d.min(settled)));
                        }
                    }
                    if stations_ready(&listed) {
                        let at = settled.max(stations_not_before);
                        stations_due = Some(stations_due.map_or(at, |d| d.min(at)));
                    }
                }
                changed = joined.changed() => {
                    if changed.is_err() {
                        // The node loop is gone: the process is ending.
                        std::future::pending::<()>().await;
                    }
                    let overlays = !joined.borrow_and_update().overlays.is_empty();
                    if !nads_watched && overlays {
                        nads_watched = true;
                        all.push(dynamic_watch(
                            &client,
                            (
                                "k8s.cni.cncf.io",
                                "v1",
                                "NetworkAttachmentDefinition",
                                "network-attachment-definitions",
                            ),
                            Change::Nad,
                        ));
                        info!("watching the pods and NADs: the overlays' stations");
                    }
                    if stations_ready(&listed) {
                        stations_due = Some(Instant::now().max(stations_not_before));
                    }
                }
                _ = sleep_until(wake) => {
                    let now = Instant::now();
                    if stations_due.is_some_and(|d| d <= now) && stations_ready(&listed) {
                        let j = joined.borrow().clone();
                        let want = world.stations(&j);
                        let socket = socket.clone();
                        let mut st = stationer.take().expect("one pass at a time");
                        let (st, retry) = tokio::task::spawn_blocking(move || {
                            let retry = st.pass(&socket, &j, want);
                            (st, retry)
                        })
                        .await?;
                        stationer = Some(st);
                        stations_due = retry.map(|r| Instant::now() + r);
                        stations_not_before = stations_due.unwrap_or_else(Instant::now);
                    }
                    if now < next_poll && due.is_none_or(|d| now < d) {
                        continue;
                    }
                    next_poll = Instant::now() + POLL;
                    if !policy_ready(&listed) {
                        continue;
                    }
                    due = None;
                    if snap.as_ref().is_none_or(|s| s.generation != world.generation) {
                        snap = Some(std::sync::Arc::new(world.snapshot()));
                    }
                    let snapshot = snap.clone().expect("made above");
                    let socket = socket.clone();
                    let mut e = enforcer.take().expect("one pass at a time");
                    let (e, done) = tokio::task::spawn_blocking(move || {
                        let done = e.enforce(&socket, &snapshot);
                        (e, done)
                    })
                    .await?;
                    enforcer = Some(e);
                    if let Err(err) = done {
                        warn!("policy: {err:#}");
                    }
                }
            }
        }
    }

    /// Applies `ev` to `world`: a re-list's objects to `relist` until it is
    /// done, when they replace that kind's.
    fn apply(world: &mut World, relist: &mut World, listed: &mut [bool; 4], ev: Change) {
        match ev {
            Change::Pod(ev) => match *ev {
                Event::Init => relist.pods.clear(),
                Event::InitApply(p) => {
                    if let Some(v) = policy::pod_view(&p) {
                        relist.pods.insert(key(&p.metadata), v);
                    }
                }
                Event::InitDone => {
                    world.pods = std::mem::take(&mut relist.pods);
                    listed[PODS] = true;
                }
                Event::Apply(p) => match policy::pod_view(&p) {
                    Some(v) => {
                        world.pods.insert(key(&p.metadata), v);
                    }
                    None => {
                        world.pods.remove(&key(&p.metadata));
                    }
                },
                Event::Delete(p) => {
                    world.pods.remove(&key(&p.metadata));
                }
            },
            Change::Namespace(ev) => {
                let labels = |n: &Namespace| n.metadata.labels.clone().unwrap_or_default();
                let name = |n: &Namespace| n.metadata.name.clone().unwrap_or_default();
                match ev {
                    Event::Init => relist.namespaces.clear(),
                    Event::InitApply(n) => {
                        relist.namespaces.insert(name(&n), labels(&n));
                    }
                    Event::InitDone => {
                        world.namespaces = std::mem::take(&mut relist.namespaces);
                        listed[NAMESPACES] = true;
                    }
                    Event::Apply(n) => {
                        world.namespaces.insert(name(&n), labels(&n));
                    }
                    Event::Delete(n) => {
                        world.namespaces.remove(&name(&n));
                    }
                }
            }
            Change::Policy(ev) => match ev {
                Event::Init => relist.policies.clear(),
                Event::InitApply(o) => {
                    if let Some(v) = policy::policy_view(&o) {
                        relist.policies.insert(key(&o.metadata), v);
                    }
                }
                Event::InitDone => {
                    world.policies = std::mem::take(&mut relist.policies);
                    listed[POLICIES] = true;
                }
                Event::Apply(o) => match policy::policy_view(&o) {
                    Some(v) => {
                        world.policies.insert(key(&o.metadata), v);
                    }
                    None => {
                        warn!(policy = ?key(&o.metadata), "a MultiNetworkPolicy whose spec does not read: ignored");
                        world.policies.remove(&key(&o.metadata));
                    }
                },
                Event::Delete(o) => {
                    world.policies.remove(&key(&o.metadata));
                }
            },
            Change::Nad(ev) => match ev {
                Event::Init => relist.nads.clear(),
                Event::InitApply(o) => {
                    if let Some((k, n)) = stations::nad_view(&o) {
                        relist.nads.insert(k, n);
                    }
                }
                Event::InitDone => {
                    world.nads = std::mem::take(&mut relist.nads);
                    listed[NADS] = true;
                }
                Event::Apply(o) => {
                    if let Some((k, n)) = stations::nad_view(&o) {
                        world.nads.insert(k, n);
                    }
                }
                Event::Delete(o) => {
                    if let Some((k, _)) = stations::nad_view(&o) {
                        world.nads.remove(&k);
                    }
                }
            },
        }
    }

    /// The stations given to the switch: each VTEP's as last sent (and
    /// when), sent again where they changed or the switch lost them (it
    /// restarted: a count listed after the send differs).
    struct Stationer {
        sent: BTreeMap<(String, IpAddr), (Vec<switchyard_api::RemoteStation>, Instant)>,
        /// The wait before the next try after a failure (from 1 s,
        /// doubling up to the cap).
        wait: Duration,
        cap: Duration,
    }

    /// A VTEP and its stations.
    type VtepStations = (IpAddr, Vec<switchyard_api::RemoteStation>);

    /// Most VTEPs' stations in one request (a thousand nodes' in a few).
    const SETS_PER_REQUEST: usize = 256;

    impl Stationer {
        fn new(cap: Duration) -> Stationer {
            Stationer {
                sent: BTreeMap::new(),
                wait: Duration::ZERO,
                cap,
            }
        }

        /// Gives each of the switch's VTEPs (as `j` last saw them) the
        /// stations of `want` where they differ from what it was sent, or
        /// where the switch's count, listed after the send, says it does
        /// not have them: each overlay's in as few requests as can hold
        /// them. Returns the wait before trying again if any was refused.
        fn pass(&mut self, socket: &Path, j: &Joined, mut want: Stations) -> Option<Duration> {
            // A VTEP the switch no longer has took its stations with it.
            self.sent.retain(|k, _| j.stations.contains_key(k));
            let mut changed: BTreeMap<&str, Vec<VtepStations>> = BTreeMap::new();
            for (k, count) in &j.stations {
                let w = want.remove(k).unwrap_or_default();
                let had = self.sent.get(k);
                let same = had.map_or(w.is_empty(), |(h, _)| *h == w);
                let lost = had.map_or(*count != 0, |(h, at)| j.listed > *at && *count != h.len());
                if !same || lost {
                    changed.entry(k.0.as_str()).or_default().push((k.1, w));
                }
            }
            if changed.is_empty() {
                self.wait = Duration::ZERO;
                return None;
            }
            let mut c = Client::lazy(socket);
            c.set_retry(Duration::from_secs(3));
            let (mut updated, mut failed) = (0usize, 0usize);
            // A refused request whose sets are several is tried one set at
            // a time, so that one VTEP's refusal holds back no other; a
            // switch that does not answer ends the pass (the rest wait for
            // the next).
            let mut requests: Vec<(&str, Vec<VtepStations>)> = Vec::new();
            for (overlay, sets) in changed {
                for chunk in sets.chunks(SETS_PER_REQUEST) {
                    requests.push((overlay, chunk.to_vec()));
                }
            }
            let mut unanswered = false;
            while let Some((overlay, chunk)) = requests.pop() {
                if unanswered {
                    failed += chunk.len();
                    continue;
                }
                let req = chunk
                    .iter()
                    .map(|(remote, stations)| switchyard_api::StationSet {
                        remote: *remote,
                        stations: stations.clone(),
                    })
                    .collect();
                match c.ask(&Request::vtep_station_sets(overlay, req)) {
                    Ok(()) => {
                        let now = Instant::now();
                        for (remote, w) in chunk {
                            debug!(%overlay, %remote, stations = w.len(), "stations");
                            updated += 1;
                            self.sent.insert((overlay.to_string(), remote), (w, now));
                        }
                    }
                    Err(e) => {
                        for (remote, _) in &chunk {
                            self.sent.remove(&(overlay.to_string(), *remote));
                        }
                        let refused = matches!(&e, switchyard_api::ClientError::Api(a)
                            if a.code == switchyard_api::ErrorCode::InvalidArgument);
                        if refused && chunk.len() > 1 {
                            requests.extend(chunk.into_iter().map(|s| (overlay, vec![s])));
                            continue;
                        }
                        warn!(%overlay, vteps = chunk.len(), "stations not set: {e}");
                        failed += chunk.len();
                        unanswered |= !refused;
                    }
                }
            }
            if updated > 0 {
                let total: usize = self.sent.values().map(|(s, _)| s.len()).sum();
                info!(vteps = updated, stations = total, "stations updated");
            }
            if failed == 0 {
                self.wait = Duration::ZERO;
                return None;
            }
            self.wait = (self.wait * 2).clamp(Duration::from_secs(1), self.cap);
            warn!(
                vteps = failed,
                "stations not set, trying again in {:?}", self.wait
            );
            Some(self.wait)
        }
    }

    /// The ports brought to what the policies say, remembering what each
    /// was given for which pod, so that a pass with nothing changed asks
    /// the switch for its ports and computes nothing.
    struct Enforcer {
        /// The world's generation `given` was computed in.
        generation: u64,
        /// Per port: the pod's UID it was computed for, and the policy.
        given: BTreeMap<String, (Option<String>, Option<switchyard_api::policy::PortPolicy>)>,
        /// Ports the switch refused a policy.
        failed: BTreeMap<String, Refused>,
        cap: Duration,
    }

    /// A policy the switch refused a port.
    struct Refused {
        /// When to try again.
        next: Instant,
        /// The wait before that (from 1 s, doubling up to the cap).
        wait: Duration,
        /// What was refused: something else is tried at once.
        want: Option<switchyard_api::policy::PortPolicy>,
    }

    impl Enforcer {
        fn new(cap: Duration) -> Enforcer {
            Enforcer {
                generation: 0,
                given: BTreeMap::new(),
                failed: BTreeMap::new(),
                cap,
            }
        }

        /// Gives each port of the switch that serves a known pod the
        /// policy the policies make for it, where that changed. A port
        /// whose pod is not known (yet, or any more), is another pod of
        /// the same name (its UID differs), or has no network-status entry
        /// for the port's interface yet is left as it is: what it has is
        /// the last thing known. A port the switch refuses is reported, the
        /// others are still done, and it is tried again at a later pass
        /// (backing off), or at once when its policy changes.
        fn enforce(&mut self, socket: &Path, w: &Snapshot) -> anyhow::Result<()> {
            if w.generation != self.generation {
                self.given.clear();
                self.generation = w.generation;
            }
            let mut c = Client::lazy(socket);
            c.set_retry(Duration::from_secs(3));
            let ports = c.ask(&Request::port_list())?;
            let now = Instant::now();
            self.failed
                .retain(|name, _| ports.iter().any(|p| p.spec.name == *name));
            let mut failed = Vec::new();
            for p in ports {
                let Some(a) = p.spec.pod.as_ref().filter(|_| p.status.failed.is_none()) else {
                    continue;
                };
                if let Some((uid, want)) = self.given.get(&p.spec.name) {
                    if *uid == a.uid && *want == p.spec.policy {
                        continue;
                    }
                }
                let Some(pod) = w.pods.iter().find(|v| {
                    v.namespace == a.namespace
                        && v.name == a.name
                        && (a.uid.is_none() || v.uid.is_none() || a.uid == v.uid)
                }) else {
                    continue;
                };
                if !pod.networks.iter().any(|n| n.interface == a.interface) {
                    continue;
                }
                let want =
                    policy::port_policy(pod, &a.interface, &w.pods, &w.namespaces, &w.policies);
                // Refused a while ago: tried again when its wait is over,
                // or at once if it is to be given something else.
                if self
                    .failed
                    .get(&p.spec.name)
                    .is_some_and(|r| now < r.next && r.want == want)
                {
                    continue;
                }
                if want != p.spec.policy {
                    let rules = |d: &Option<Vec<_>>| d.as_ref().map(Vec::len);
                    info!(
                        port = %p.spec.name, pod = %format!("{}/{}", a.namespace, a.name),
                        ingress_rules = ?want.as_ref().and_then(|w| rules(&w.ingress)),
                        egress_rules = ?want.as_ref().and_then(|w| rules(&w.egress)),
                        "policy"
                    );
                    let set = Request::port_set(
                        &p.spec.name,
                        None,
                        Some(want.clone().unwrap_or_default()),
                        None,
                    );
                    if let Err(e) = c.ask(&set) {
                        let wait = self
                            .failed
                            .get(&p.spec.name)
                            .map_or(Duration::from_secs(1), |r| (r.wait * 2).min(self.cap));
                        warn!(port = %p.spec.name, "policy not set, trying again in {wait:?}: {e:#}");
                        let next = now + wait;
                        let r = Refused { next, wait, want };
                        self.failed.insert(p.spec.name.clone(), r);
                        failed.push(p.spec.name.clone());
                        continue;
                    }
                }
                self.failed.remove(&p.spec.name);
                self.given
                    .insert(p.spec.name.clone(), (a.uid.clone(), want));
            }
            anyhow::ensure!(
                failed.is_empty(),
                "ports not given their policy: {}",
                failed.join(", ")
            );
            Ok(())
        }
    }
}

/// The node's slices of the overlays' addresses, claimed as Leases
/// (`switchyard_vtep_sync::slices`) and handed to the switch.
mod claims {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use anyhow::Context;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
    use kube::Api;
    use switchyard_api::overlay::{NodeIpam, OverlayIpam};
    use switchyard_api::{Client, Request};
    use switchyard_vtep_sync::slices::{self, Claim, Step, OVERLAY_LABEL};
    use tokio::time::Instant;
    use tracing::{info, warn};

    /// How many times a pass lists and claims again when another node
    /// claimed the same slice first (409).
    const TRIES: usize = 8;

    /// What the node holds, and when the Leases are looked at again.
    pub struct Claims {
        api: Api<Lease>,
        namespace: String,
        node: String,
        /// Per overlay: the slice the switch was given, the split it is a
        /// slice of, and the node object's UID it was claimed for.
        held: BTreeMap<String, (u32, OverlayIpam, String)>,
        next_check: Instant,
        every: Duration,
    }

    impl Claims {
        /// Claims of node `node` in `namespace` through `api`, checked
        /// every `every` while nothing changes.
        pub fn new(api: Api<Lease>, namespace: &str, node: &str, every: Duration) -> Claims {
            Claims {
                api,
                namespace: namespace.to_string(),
                node: node.to_string(),
                held: BTreeMap::new(),
                next_check: Instant::now(),
                every,
            }
        }

        /// Gives the switch a slice of each overlay of `ipams` (the
        /// overlays that split their addresses, as the switch reports
        /// them): the one the node holds, or one it claims. An overlay
        /// whose switch hands out what the node was last seen to hold, for
        /// the same node object, is passed over until the next check, and
        /// then its Lease alone is read back (a list of the overlay's
        /// claims only when the node claims). `uid` is the node object's.
        pub async fn pass(
            &mut self,
            uid: Option<&str>,
            ipams: &[(String, NodeIpam)],
            socket: &Path,
        ) -> anyhow::Result<()> {
            self.held.retain(|o, _| ipams.iter().any(|(n, _)| n == o));
            if ipams.is_empty() {
                return Ok(());
            }
            let Some(uid) = uid else {
                anyhow::bail!(
                    "this node ({}) is not among the nodes listed: its slices of the overlays' addresses wait for it",
                    self.node
                );
            };
            let due = Instant::now() >= self.next_check;
            let mut first = None;
            for (overlay, ipam) in ipams {
                let same = self.held.get(overlay).is_some_and(|(s, split, u)| {
                    ipam.slice == Some(*s) && *split == ipam.config && u == uid
                });
                if same && (!due || self.still_held(uid, overlay, ipam.slice).await) {
                    continue;
                }
                match self.claim(uid, overlay, ipam, socket).await {
                    Ok(s) => {
                        self.held
                            .insert(overlay.clone(), (s, ipam.config.clone(), uid.to_string()));
                    }
                    Err(e) => {
                        self.held.remove(overlay);
                        first.get_or_insert(e);
                    }
                }
            }
            if due {
                self.next_check = Instant::now() + self.every;
            }
            first.map_or(Ok(()), Err)
        }

        /// Whether the node's Lease of `slice` of `overlay` is still there
        /// and its own (one read; an error counts as not).
        async fn still_held(&self, uid: &str, overlay: &str, slice: Option<u32>) -> bool {
            let Some(s) = slice else {
                return false;
            };
            let Ok(l) = self.api.get(&slices::lease_name(overlay, s)).await else {
                return false;
            };
            serde_json::to_value(&l)
                .ok()
                .and_then(|v| Claim::from_lease(overlay, &v))
                .is_some_and(|c| c.is_own(&self.node, uid))
        }

        /// The slice of `overlay` the node holds or claims, given to the
        /// switch; its other claims deleted.
        async fn claim(
            &self,
            uid: &str,
            overlay: &str,
            ipam: &NodeIpam,
            socket: &Path,
        ) -> anyhow::Result<u32> {
            let slices = ipam.config.slices();
            let selector = format!("{OVERLAY_LABEL}={overlay}");
            for _ in 0..TRIES {
                let listed = self
                    .api
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .with_context(|| format!("listing the claims of overlay {overlay}'s slices"))?;
                let claims: Vec<Claim> = listed
                    .items
                    .iter()
                    .filter_map(|l| Claim::from_lease(overlay, &serde_json::to_value(l).ok()?))
                    .collect();
                if let Some(c) = ipam
                    .slice
                    .and_then(|s| claims.iter().find(|c| c.slice == s))
                    .filter(|c| c.holder != self.node)
                {
                    warn!(
                        %overlay, slice = c.slice, holder = %c.holder,
                        "the switch hands out a slice another node holds: this node's pods that have addresses from it collide with that node's; new pods get another slice"
                    );
                }
                let step = slices::step(&self.node, uid, &claims, slices, ipam.slice);
                if let Step::Reclaim(s) = step {
                    // The node's previous object's claim: deleted (if it
                    // is still that one), then claimed for this one.
                    let stale = claims
                        .iter()
                        .find(|c| c.slice == s)
                        .and_then(|c| c.uid.clone());
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: stale,
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match self.api.delete(&slices::lease_name(overlay, s), &dp).await {
                        Ok(_) => info!(%overlay, slice = s, "released the slice's claim by this node's previous object, to claim it again"),
                        Err(kube::Error::Api(e)) if e.is_not_found() || e.is_conflict() => {}
                        Err(e) => {
                            return Err(e).with_context(|| {
                                format!("releasing the previous node object's claim of slice {s} of overlay {overlay}")
                            })
                        }
                    }
                }
                let s = match step {
                    Step::Hold(s) => s,
                    Step::Claim(s) | Step::Reclaim(s) => {
                        let lease: Lease = serde_json::from_value(slices::lease(
                            &self.namespace,
                            overlay,
                            s,
                            &self.node,
                            uid,
                        ))
                        .context("a claim's Lease")?;
                        match self.api.create(&PostParams::default(), &lease).await {
                            Ok(_) => info!(%overlay, slice = s, "claimed a slice of the overlay's addresses"),
                            Err(kube::Error::Api(e)) if e.is_already_exists() => {
                                info!(%overlay, slice = s, "another node claimed the slice first: looking again");
                                continue;
                            }
                            Err(e) => {
                                return Err(e).with_context(|| {
                                    format!("claiming slice {s} of overlay {overlay}")
                                })
                            }
                        }
                        s
                    }
                    Step::Exhausted => anyhow::bail!(
                        "every one of overlay {overlay}'s {slices} slices is held by a node: this node gets none (give the overlay's ipam a larger subnet or a longer node_prefix)"
                    ),
                };
                if ipam.slice != Some(s) {
                    set_slice(socket, overlay, s).await?;
                }
                for c in slices::extra(&self.node, uid, s, &claims) {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: c.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match self.api.delete(&c.name, &dp).await {
                        Ok(_) => {
                            info!(%overlay, slice = c.slice, "released a slice this node held besides its own")
                        }
                        Err(kube::Error::Api(e)) if e.is_not_found() || e.is_conflict() => {}
                        Err(e) => warn!(%overlay, slice = c.slice, "releasing a slice: {e}"),
                    }
                }
                return Ok(s);
            }
            anyhow::bail!(
                "overlay {overlay}: each slice this node tried was claimed first by another node ({TRIES} tries)"
            )
        }
    }

    /// Has the switch hand out slice `slice` of `overlay`.
    async fn set_slice(socket: &Path, overlay: &str, slice: u32) -> anyhow::Result<()> {
        let (socket, o): (PathBuf, String) = (socket.to_path_buf(), overlay.to_string());
        let info = tokio::task::spawn_blocking(move || {
            let mut c = Client::lazy(&socket);
            c.set_retry(Duration::from_secs(3));
            c.ask(&Request::overlay_slice(&o, Some(slice)))
        })
        .await
        .context("the switch's task")?
        .with_context(|| format!("giving the switch slice {slice} of overlay {overlay}"))?;
        let ranges: Vec<String> = info
            .ipam
            .iter()
            .flat_map(|i| &i.ranges)
            .map(|r| format!("{}-{}", r.range_start, r.range_end))
            .collect();
        info!(%overlay, slice, ranges = %ranges.join(" "), "the switch hands out the node's slice");
        Ok(())
    }
}

/// Whether `a` is an address of one of the host's interfaces (whether a
/// socket can be bound to it says less: `ip_nonlocal_bind` allows any).
fn is_host_address(a: IpAddr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    addrs.filter_map(|i| i.address).any(|s| {
        let v4 = s.as_sockaddr_in().map(|x| IpAddr::V4(x.ip()));
        let v6 = s.as_sockaddr_in6().map(|x| IpAddr::V6(x.ip()));
        v4.or(v6) == Some(a)
    })
}

/// How long publishing this node's VTEP address may take before the sync
/// goes on without it (tried again at the next retry).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes `vtep` as this node's VTEP address ([`VTEP_ANNOTATION`]), so
/// that the other nodes send to it and expect it, through the Node's
/// status as flannel patches its annotations (`pkg/subnet/kube/kube.go`
/// `AcquireLease`: the RBAC needs `patch` on `nodes/status` only).
async fn publish(api: &Api<Node>, node: &str, vtep: IpAddr) -> anyhow::Result<()> {
    let patch =
        serde_json::json!({"metadata": {"annotations": {VTEP_ANNOTATION: vtep.to_string()}}});
    let what = || format!("publishing {vtep} as node {node}'s VTEP ({VTEP_ANNOTATION})");
    tokio::time::timeout(
        PUBLISH_TIMEOUT,
        api.patch_status(node, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer in {PUBLISH_TIMEOUT:?}"))
    .with_context(what)?
    .with_context(what)?;
    info!(%vtep, "published this node's VTEP address");
    Ok(())
}

/// The overlays filled with the VLANs each carries across, and the
/// switch's VTEPs of them with how many stations each has.
type VtepsJoined = (
    tokio::time::Instant,
    BTreeMap<String, Vec<u16>>,
    BTreeMap<(String, IpAddr), usize>,
);

/// What a sync found and did.
#[derive(Default)]
struct Outcome {
    /// The overlays filled.
    overlays: Vec<String>,
    /// Those that split their addresses in slices, as the switch has them
    /// (`None`: the switch did not answer).
    ipams: Option<Vec<(String, NodeIpam)>>,
    /// The overlays filled with the VLANs each carries across, and the
    /// switch's VTEPs of them after the sync with their stations' count
    /// (`None`: the switch did not answer).
    joined: Option<VtepsJoined>,
    /// The first thing that failed, if any did.
    error: Option<anyhow::Error>,
}

/// Brings the switch's overlays to `remotes` (address, node), their
/// tunnels leaving from `local` where it is given: adds what they lack,
/// takes out what no node has. A VTEP that cannot be added or taken out is
/// reported and the others done all the same.
fn sync(
    socket: &Path,
    wanted: &[String],
    remotes: &BTreeMap<IpAddr, String>,
    local: Option<IpAddr>,
) -> Outcome {
    let mut out = Outcome::default();
    let asked = (|| -> anyhow::Result<_> {
        // Asked again while the switch restarts (its socket missing or
        // refused) or is taken over, for a few seconds: longer, the sync
        // itself is tried again later (and SIGTERM waits for no more).
        let mut c = Client::lazy(socket);
        c.set_retry(Duration::from_secs(3));
        let bridges = c.ask(&Request::bridge_list())?;
        let overlays = if wanted.is_empty() {
            plan::overlays(&bridges)
        } else {
            wanted.to_vec()
        };
        let kinds: BTreeMap<String, Vec<u16>> = bridges
            .iter()
            .filter(|b| overlays.contains(&b.name))
            .map(|b| (b.name.clone(), b.overlay_vlans.clone()))
            .collect();
        let ipams = bridges
            .into_iter()
            .filter(|b| overlays.contains(&b.name))
            .filter_map(|b| Some((b.name, b.ipam?)))
            .collect();
        let listed = tokio::time::Instant::now();
        let current = c.ask(&Request::vtep_list())?;
        Ok((c, overlays, kinds, ipams, listed, current))
    })();
    let (mut c, overlays, kinds, ipams, listed, current) = match asked {
        Ok(a) => a,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    let addrs = remotes.keys().copied().collect();
    let p = plan(&overlays, &addrs, local, &current);
    out.overlays = overlays;
    out.ipams = Some(ipams);
    let mut vteps: BTreeMap<(String, IpAddr), usize> = current
        .iter()
        .filter(|v| kinds.contains_key(&v.overlay))
        .map(|v| ((v.overlay.clone(), v.remote), v.stations))
        .collect();
    let node = |a: &IpAddr| remotes.get(a).map_or("(gone)", String::as_str).to_string();
    for v in &p.add {
        match c.ask(&Request::vtep_add(&v.overlay, v.remote, v.local)) {
            Ok(j) => {
                info!(overlay = %v.overlay, remote = %v.remote, node = %node(&v.remote), local = %j.local, "joined");
                vteps.insert((v.overlay.clone(), v.remote), j.stations);
            }
            Err(e) => {
                let e = anyhow::Error::new(e).context(format!(
                    "joining {} to {} ({})",
                    v.overlay,
                    v.remote,
                    node(&v.remote)
                ));
                warn!("{e:#}");
                out.error.get_or_insert(e);
            }
        }
    }
    for v in &p.del {
        match c.ask(&Request::vtep_del(&v.overlay, v.remote)) {
            Ok(()) => {
                info!(overlay = %v.overlay, remote = %v.remote, "left: no node has it");
                vteps.remove(&(v.overlay.clone(), v.remote));
            }
            Err(e) => {
                let e = anyhow::Error::new(e)
                    .context(format!("taking {} out of {}", v.remote, v.overlay));
                warn!("{e:#}");
                out.error.get_or_insert(e);
            }
        }
    }
    out.joined = Some((listed, kinds, vteps));
    out
}
