/*
 * hostgen: the loop benchmark's generator for the many-hosts cell.
 *
 * testpmd cannot vary the source MAC of the frames it sends, so this small
 * DPDK program takes its place there: two ports (the same vdevs testpmd
 * gets: memif, virtio_user, af_packet), frames put in flight on each, and a
 * forwarding loop that sends every frame received on one port out of the
 * other - as testpmd's mac forwarding does - but rewrites its addresses to
 * the next of N hosts: port 0's side has hosts A0..A(N-1), port 1's side
 * B0..B(N-1), and the k-th frame a port sends carries src = its side's host
 * k mod N, dst = the other side's host k mod N, in its Ethernet and its
 * IPv4 header (UDP, as testpmd's txonly frames). A switch between the ports
 * learns 2N addresses, each always behind the same port, and looks one up
 * on every frame.
 *
 * Built by loop_bench.py (cc -O3 $(pkg-config --cflags --libs libdpdk)).
 *
 *   hostgen EAL-OPTIONS -- HOSTS SIZE BURSTS QUEUES DESCRIPTORS WARMUP SECONDS
 *
 * SIZE counts the CRC (a 64-byte frame carries 60 bytes). QUEUES is the
 * queue pairs of both ports ("2") or of each ("1,2": the uplink cell, where
 * OVS-DPDK needs two on its memif port and net_af_xdp on a one-queue veth
 * has one); a frame received on queue q leaves on queue q mod the other
 * port's queues. BURSTS bursts of 32 frames are put in flight per port and
 * queue of the port with fewer queues, so that every port has the same
 * frames in flight whatever its queues (spread over them in turn). It
 * prints "links up",
 * then, after WARMUP seconds of forwarding, the frames both ports received
 * over SECONDS as "rx_pps N", and exits.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_memory.h>
#include <rte_udp.h>

#define BURST 32
#define MAX_QUEUES 8

static volatile int running = 1;
static uint32_t hosts;
/* Queue pairs of port 0 and port 1. */
static uint16_t nb_queues[2];
/* Frames received per port, written by the forwarding lcore only. */
static volatile uint64_t rx_count[2];
/* TSC cycles of the forwarding loop, and those spent in passes over the
 * receive queues that found no frame: the idle share says whether the
 * generator waited for the DUT (a generator that never waits may be the
 * loop's limit). */
static volatile uint64_t loop_cycles, idle_cycles;

/* Host i of side s (0: port 0's, 1: port 1's), locally administered. */
static void host_mac(struct rte_ether_addr *a, int side, uint32_t i)
{
	a->addr_bytes[0] = 0x02;
	a->addr_bytes[1] = 0x50 + side;
	a->addr_bytes[2] = 0;
	a->addr_bytes[3] = (i >> 16) & 0xff;
	a->addr_bytes[4] = (i >> 8) & 0xff;
	a->addr_bytes[5] = i & 0xff;
}

/* Host i of side s's IPv4 address: 10.(s * 64 + i / 65536).(i / 256).(i). */
static inline rte_be32_t host_ip(int side, uint32_t i)
{
	return rte_cpu_to_be_32((10u << 24) | ((uint32_t)side << 22) | (i & 0x3fffff));
}

/*
 * The IPv4 header fields of a frame of `len` bytes (no CRC) that are the
 * same in every frame, on a zeroed header (UDP, as testpmd's txonly).
 */
static void ip_fixed_fields(struct rte_ipv4_hdr *ip, uint16_t len)
{
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->total_length = rte_cpu_to_be_16(len - sizeof(struct rte_ether_hdr));
}

/*
 * The one's-complement sum of the IPv4 header's words that are the same in
 * every frame (addresses and checksum taken as 0), set once the frame size
 * is known: a frame's checksum is this plus its two addresses, folded.
 */
static uint32_t ip_fixed_sum;

/* The IPv4 header checksum of a frame from `src` to `dst` (as stored). */
static inline uint16_t ip_cksum(rte_be32_t src, rte_be32_t dst)
{
	uint32_t s = ip_fixed_sum + (src & 0xffff) + (src >> 16) + (dst & 0xffff) + (dst >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (uint16_t)~s;
}

/*
 * The addresses of frame k sent out of `port`, Ethernet and IPv4 (hosts
 * differ in both, as real ones do: a DUT that hashes the 5-tuple, as OVS's
 * caches do, sees a flow per host pair). The same bytes as host_mac and
 * host_ip give, in two stores for the MACs and a checksum from the two
 * addresses (check_address compares them): this runs for every frame the
 * generator forwards, and a byte-wise version with a whole-header checksum
 * made hostgen, not the DUT, what limited the memif many-hosts cells.
 */
static inline void address(struct rte_ether_hdr *eth, uint16_t port, uint32_t k)
{
	/* k's low three bytes, most significant first (k < 2^22). */
	uint64_t kb = rte_bswap32(k) >> 8;
	/* dst 02:(50 + other side):00:k k k, then src's first two bytes 02:(50 + side). */
	uint64_t w0 = 0x02 | (uint64_t)(0x50 + 1 - port) << 8 | kb << 24 | (uint64_t)0x02 << 48 |
		      (uint64_t)(0x50 + port) << 56;
	/* src's last four bytes 00:k k k. */
	uint32_t w1 = (uint32_t)kb << 8;
	memcpy(eth, &w0, sizeof(w0));
	memcpy((uint8_t *)eth + sizeof(w0), &w1, sizeof(w1));
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	rte_be32_t src = host_ip(port, k), dst = host_ip(1 - port, k);
	ip->src_addr = src;
	ip->dst_addr = dst;
	ip->hdr_checksum = ip_cksum(src, dst);
}

/*
 * Exits unless address() writes frame k of `port` (a frame of `size`
 * bytes, CRC counted) as host_mac, host_ip and DPDK's rte_ipv4_cksum
 * would.
 */
static void check_address(uint16_t port, uint32_t k, uint16_t size)
{
	/* The headers as in a frame: IPv4 right after Ethernet. */
	uint64_t buf[8];
	memset(buf, 0, sizeof(buf));
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)buf;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	ip_fixed_fields(ip, size - 4);
	address(eth, port, k);
	struct rte_ether_addr src, dst;
	host_mac(&src, port, k);
	host_mac(&dst, 1 - port, k);
	uint16_t fast = ip->hdr_checksum;
	ip->hdr_checksum = 0;
	if (!rte_is_same_ether_addr(&src, &eth->src_addr) ||
	    !rte_is_same_ether_addr(&dst, &eth->dst_addr) || ip->src_addr != host_ip(port, k) ||
	    ip->dst_addr != host_ip(1 - port, k) || rte_ipv4_cksum(ip) != fast)
		rte_exit(EXIT_FAILURE, "frame %u of port %u: addresses or checksum wrong\n", k,
			 port);
}

/* A UDP/IPv4 frame of `len` bytes (no CRC), as testpmd's txonly builds. */
static struct rte_mbuf *make_frame(struct rte_mempool *pool, uint16_t port, uint32_t k,
				   uint16_t len)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(pool);
	if (m == NULL)
		return NULL;
	char *p = rte_pktmbuf_append(m, len);
	if (p == NULL) {
		rte_pktmbuf_free(m);
		return NULL;
	}
	memset(p, 0, len);
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	ip_fixed_fields(ip, len);
	address(eth, port, k);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	udp->src_port = rte_cpu_to_be_16(9);
	udp->dst_port = rte_cpu_to_be_16(9);
	udp->dgram_len = rte_cpu_to_be_16(len - sizeof(*eth) - sizeof(*ip));
	return m;
}

static int forward(void *arg)
{
	(void)arg;
	uint32_t next[2] = {0, 0}; /* the next host index per sending port */
	struct rte_mbuf *pkts[BURST];
	uint64_t last = rte_rdtsc();
	while (running) {
		uint16_t got = 0;
		for (uint16_t in = 0; in < 2; in++) {
			uint16_t out = 1 - in;
			for (uint16_t q = 0; q < nb_queues[in]; q++) {
				uint16_t n = rte_eth_rx_burst(in, q, pkts, BURST);
				if (n == 0)
					continue;
				got += n;
				rx_count[in] += n;
				uint32_t k = next[out];
				for (uint16_t i = 0; i < n; i++) {
					address(rte_pktmbuf_mtod(pkts[i], struct rte_ether_hdr *), out, k);
					if (++k == hosts)
						k = 0;
				}
				next[out] = k;
				uint16_t sent = rte_eth_tx_burst(out, q % nb_queues[out], pkts, n);
				if (sent < n)
					rte_pktmbuf_free_bulk(&pkts[sent], n - sent);
			}
		}
		uint64_t now = rte_rdtsc();
		loop_cycles += now - last;
		if (got == 0)
			idle_cycles += now - last;
		last = now;
	}
	return 0;
}

/*
 * DPDK's zero-copy memif client (22.11, memif_connect) closes the file
 * descriptor of each memseg list it shared once its port connects, but the
 * descriptor is the EAL's own (rte_memseg_get_fd), shared by every port. A
 * second port whose handshake comes later then sends a closed descriptor
 * (its sendmsg fails with EBADF and the port never connects) or whatever
 * has taken the number since. So the ports start one after the other, each
 * once the one before is up, and the EAL's descriptors are put back in
 * between, from copies taken before any port started.
 */
#define MAX_FDS 64
static int eal_fd[MAX_FDS], copy_fd[MAX_FDS];
static int nb_fds;

static int save_fd(const struct rte_memseg_list *msl, const struct rte_memseg *ms, void *arg)
{
	(void)msl;
	(void)arg;
	int fd = rte_memseg_get_fd_thread_unsafe(ms);
	if (fd < 0)
		return 0; /* no descriptor (memory no port can share) */
	for (int i = 0; i < nb_fds; i++)
		if (eal_fd[i] == fd)
			return 0;
	if (nb_fds == MAX_FDS)
		rte_exit(EXIT_FAILURE, "more than %d memseg descriptors\n", MAX_FDS);
	int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (copy < 0)
		rte_exit(EXIT_FAILURE, "dup of memseg descriptor %d: %s\n", fd, strerror(errno));
	eal_fd[nb_fds] = fd;
	copy_fd[nb_fds++] = copy;
	return 0;
}

/* Puts back each EAL descriptor a port closed; stops if its number went
 * to another file meanwhile (the run is then tried again). */
static void restore_fds(void)
{
	for (int i = 0; i < nb_fds; i++) {
		struct stat now, want;
		if (fstat(copy_fd[i], &want) < 0)
			rte_exit(EXIT_FAILURE, "memseg copy %d: %s\n", copy_fd[i], strerror(errno));
		if (fstat(eal_fd[i], &now) == 0) {
			if (now.st_dev != want.st_dev || now.st_ino != want.st_ino)
				rte_exit(EXIT_FAILURE,
					 "memseg descriptor %d closed and reused meanwhile\n",
					 eal_fd[i]);
			continue; /* still open */
		}
		if (errno != EBADF || dup2(copy_fd[i], eal_fd[i]) < 0)
			rte_exit(EXIT_FAILURE, "memseg descriptor %d: %s\n", eal_fd[i],
				 strerror(errno));
		printf("memseg descriptor %d put back after a port closed it\n", eal_fd[i]);
	}
}

static void on_signal(int sig)
{
	(void)sig;
	running = 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: hostgen EAL-OPTIONS -- HOSTS SIZE BURSTS QUEUES DESCRIPTORS "
			"WARMUP SECONDS\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int used = rte_eal_init(argc, argv);
	if (used < 0)
		rte_exit(EXIT_FAILURE, "EAL initialisation failed\n");
	argc -= used;
	argv += used;
	if (argc != 8)
		usage();
	hosts = strtoul(argv[1], NULL, 10);
	uint16_t size = strtoul(argv[2], NULL, 10);
	uint32_t bursts = strtoul(argv[3], NULL, 10);
	char *rest;
	nb_queues[0] = strtoul(argv[4], &rest, 10);
	nb_queues[1] = *rest == ',' ? strtoul(rest + 1, &rest, 10) : nb_queues[0];
	if (*rest != '\0')
		usage();
	uint16_t desc = strtoul(argv[5], NULL, 10);
	double warmup = atof(argv[6]);
	double seconds = atof(argv[7]);
	if (hosts == 0 || hosts > 1u << 22 || size < 64 || size > 1518 || desc == 0 ||
	    seconds <= 0)
		usage();
	for (int port = 0; port < 2; port++)
		if (nb_queues[port] == 0 || nb_queues[port] > MAX_QUEUES)
			usage();
	if (rte_eth_dev_count_avail() != 2)
		rte_exit(EXIT_FAILURE, "need exactly two ports, have %u\n",
			 rte_eth_dev_count_avail());
	unsigned fwd_lcore = rte_get_next_lcore(-1, 1, 0);
	if (fwd_lcore >= RTE_MAX_LCORE)
		rte_exit(EXIT_FAILURE, "need a forwarding lcore besides the main one\n");
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	uint16_t most = RTE_MAX(nb_queues[0], nb_queues[1]);
	uint16_t fewest = RTE_MIN(nb_queues[0], nb_queues[1]);
	/* Room for the rings of both ports and the frames in flight. */
	unsigned nb_mbufs = 4u * most * desc + 2u * fewest * bursts * BURST + 4096;
	struct rte_mempool *pool = rte_pktmbuf_pool_create("hostgen", nb_mbufs, 256, 0,
							   RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
	if (pool == NULL)
		rte_exit(EXIT_FAILURE, "mbuf pool of %u: %s\n", nb_mbufs, rte_strerror(rte_errno));
	for (uint16_t port = 0; port < 2; port++) {
		struct rte_eth_conf conf;
		memset(&conf, 0, sizeof(conf));
		uint16_t nq = nb_queues[port];
		int r = rte_eth_dev_configure(port, nq, nq, &conf);
		if (r < 0)
			rte_exit(EXIT_FAILURE, "port %u: configure: %s\n", port, rte_strerror(-r));
		for (uint16_t q = 0; q < nq; q++) {
			r = rte_eth_rx_queue_setup(port, q, desc, rte_eth_dev_socket_id(port), NULL,
						   pool);
			if (r < 0)
				rte_exit(EXIT_FAILURE, "port %u rxq %u: %s\n", port, q,
					 rte_strerror(-r));
			r = rte_eth_tx_queue_setup(port, q, desc, rte_eth_dev_socket_id(port), NULL);
			if (r < 0)
				rte_exit(EXIT_FAILURE, "port %u txq %u: %s\n", port, q,
					 rte_strerror(-r));
		}
		/* After the queues' memory is in place: the descriptors a
		 * zero-copy memif port shares (see save_fd). */
		if (port == 0 && rte_memseg_walk(save_fd, NULL) < 0)
			rte_exit(EXIT_FAILURE, "memseg walk failed\n");
		r = rte_eth_dev_start(port);
		if (r < 0)
			rte_exit(EXIT_FAILURE, "port %u: start: %s\n", port, rte_strerror(-r));
		rte_eth_promiscuous_enable(port);
		/* The device under test connects in its own time; the next
		 * port starts once this one is up (see save_fd). */
		for (int i = 0;; i++) {
			struct rte_eth_link l;
			rte_eth_link_get_nowait(port, &l);
			if (l.link_status)
				break;
			if (!running || i == 6000)
				rte_exit(EXIT_FAILURE, "port %u: link not up within 60 s\n", port);
			usleep(10000);
		}
		restore_fds();
	}
	printf("links up\n");
	fflush(stdout);
	usleep(500000);

	/* A memif zero-copy client posts its receive buffers when it first
	 * receives: receive once on every queue, so that the DUT finds
	 * buffers for the first frames. */
	for (uint16_t port = 0; port < 2; port++)
		for (uint16_t q = 0; q < nb_queues[port]; q++) {
			struct rte_mbuf *pkts[BURST];
			uint16_t n = rte_eth_rx_burst(port, q, pkts, BURST);
			if (n > 0)
				rte_pktmbuf_free_bulk(pkts, n);
		}
	usleep(100000);

	struct rte_ipv4_hdr fixed;
	memset(&fixed, 0, sizeof(fixed));
	ip_fixed_fields(&fixed, size - 4);
	ip_fixed_sum = rte_raw_cksum(&fixed, sizeof(fixed));
	/* The fast rewrite against the slow one: the first 4096 hosts (the low
	 * byte carrying), the middle byte carrying, the top bit and the last
	 * host. */
	const uint32_t probes[] = {65535, 65536, 1u << 21, hosts - 1};
	for (uint16_t port = 0; port < 2; port++) {
		for (size_t i = 0; i < RTE_DIM(probes); i++)
			if (probes[i] < hosts)
				check_address(port, probes[i], size);
		for (uint32_t j = 0; j < hosts && j < 4096; j++)
			check_address(port, j, size);
	}

	/* Frames in flight: host k's frames out of each port, the same number
	 * of bursts on both, each port's spread over its queues in turn. */
	uint32_t k[2] = {0, 0};
	for (uint32_t b = 0; b < bursts * fewest; b++)
		for (uint16_t port = 0; port < 2; port++) {
			struct rte_mbuf *pkts[BURST];
			uint16_t n = 0;
			for (; n < BURST; n++) {
				pkts[n] = make_frame(pool, port, k[port], size - 4);
				if (pkts[n] == NULL)
					rte_exit(EXIT_FAILURE, "out of mbufs\n");
				k[port] = (k[port] + 1) % hosts;
			}
			uint16_t sent = rte_eth_tx_burst(port, b % nb_queues[port], pkts, n);
			if (sent < n)
				rte_pktmbuf_free_bulk(&pkts[sent], n - sent);
		}

	rte_eal_remote_launch(forward, NULL, fwd_lcore);
	usleep((useconds_t)(warmup * 1e6));
	uint64_t before = rx_count[0] + rx_count[1];
	uint64_t loop0 = loop_cycles, idle0 = idle_cycles;
	uint64_t t0 = rte_get_timer_cycles();
	usleep((useconds_t)(seconds * 1e6));
	uint64_t after = rx_count[0] + rx_count[1];
	uint64_t loop1 = loop_cycles, idle1 = idle_cycles;
	uint64_t t1 = rte_get_timer_cycles();
	double secs = (double)(t1 - t0) / (double)rte_get_timer_hz();
	/* Before rx_pps, which the benchmark waits for. */
	printf("cycles %" PRIu64 " idle %" PRIu64 "\n", loop1 - loop0, idle1 - idle0);
	printf("rx_pps %.0f\n", (double)(after - before) / secs);
	fflush(stdout);
	running = 0;
	rte_eal_wait_lcore(fwd_lcore);
	for (uint16_t port = 0; port < 2; port++) {
		rte_eth_dev_stop(port);
		rte_eth_dev_close(port);
	}
	rte_eal_cleanup();
	return 0;
}
