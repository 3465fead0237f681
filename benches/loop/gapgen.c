/*
 * gapgen: the takeover benchmark's traffic and stopwatch.
 *
 * Two ports (DPDK vdevs: memif, virtio_user), the switch between them. Port
 * 0 sends a frame every INTERVAL_US microseconds to port 1's MAC, carrying a
 * sequence number; port 1 receives them. Whenever frames stop arriving for
 * longer than GAP_US, the gap is recorded (when, and how long): a takeover
 * or a restart of the switch shows as one gap. At the end (SIGINT or
 * SIGTERM) it waits a moment for frames still in the rings, then prints
 *
 *   sent S received R lost L duplicated D refused F
 *   gap AT_MS LENGTH_US      (one line per gap)
 *   skip AT_MS FRAMES        (frames missing before one that arrived)
 *   quiet MS                 (since the last frame arrived, at the end)
 *
 * "refused": frames port 0's queue did not take (its ring full while the
 * switch was away): never sent, so never lost. "lost": sent and never
 * received. Frames count from the first one sent half a second after a
 * frame came through: before, the switch and the drivers may still be
 * bringing their queues up. Frames arrive in order or not at all on this path; one that
 * arrives twice or out of order counts as duplicated.
 *
 * Built by takeover_bench.py (cc -O3 $(pkg-config --cflags --libs libdpdk)).
 *
 *   gapgen EAL-OPTIONS -- INTERVAL_US GAP_US
 *
 * It prints "links up" once both ports are.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_mbuf.h>

#define BURST 32
#define MAX_GAPS 4096
/* An EtherType for local experiments (IEEE 802). */
#define ETHERTYPE 0x88b5

static volatile int running = 1;

static void stop(int sig) {
	(void)sig;
	running = 0;
}

static void setup(uint16_t port, struct rte_mempool *pool) {
	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	/* Link-state interrupts, as testpmd asks for them: virtio_user in
	 * server mode takes a restarted backend's connection from there. */
	struct rte_eth_dev_info info;
	if (rte_eth_dev_info_get(port, &info) == 0 &&
	    (*info.dev_flags & RTE_ETH_DEV_INTR_LSC))
		conf.intr_conf.lsc = 1;
	if (rte_eth_dev_configure(port, 1, 1, &conf) < 0 ||
	    rte_eth_rx_queue_setup(port, 0, 1024, rte_socket_id(), NULL, pool) < 0 ||
	    rte_eth_tx_queue_setup(port, 0, 1024, rte_socket_id(), NULL) < 0 ||
	    rte_eth_dev_start(port) < 0) {
		fprintf(stderr, "port %u: cannot start\n", port);
		exit(1);
	}
}

static int link_up(uint16_t port) {
	struct rte_eth_link link;
	memset(&link, 0, sizeof(link));
	return rte_eth_link_get_nowait(port, &link) == 0 && link.link_status;
}

int main(int argc, char **argv) {
	int n = rte_eal_init(argc, argv);
	if (n < 0) {
		fprintf(stderr, "EAL init failed\n");
		return 1;
	}
	argc -= n;
	argv += n;
	if (argc != 3 || rte_eth_dev_count_avail() != 2) {
		fprintf(stderr, "usage: gapgen EAL -- INTERVAL_US GAP_US (two ports)\n");
		return 1;
	}
	uint64_t hz = rte_get_tsc_hz();
	uint64_t interval = strtoull(argv[1], NULL, 10) * hz / 1000000;
	uint64_t gap_min = strtoull(argv[2], NULL, 10) * hz / 1000000;
	signal(SIGINT, stop);
	signal(SIGTERM, stop);

	struct rte_mempool *pool = rte_pktmbuf_pool_create(
	    "gapgen", 8191, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
	if (!pool) {
		fprintf(stderr, "no mbuf pool\n");
		return 1;
	}
	setup(0, pool);
	setup(1, pool);
	struct rte_ether_addr mac0, mac1;
	rte_eth_macaddr_get(0, &mac0);
	rte_eth_macaddr_get(1, &mac1);
	while (running && !(link_up(0) && link_up(1)))
		rte_delay_ms(10);
	printf("links up\n");
	fflush(stdout);

	uint64_t start = rte_rdtsc(), next = start, last_rx = 0;
	/* Frames count from the first one sent half a second after one came
	 * through (before, the switch and the ports' drivers are still
	 * bringing their queues up). */
	uint64_t base = UINT64_MAX, first_rx = 0;
	uint64_t seq = 0, expect = 0, received = 0, dups = 0, refused = 0;
	static uint64_t gap_at[MAX_GAPS], gap_len[MAX_GAPS];
	static uint64_t skip_at[MAX_GAPS], skip_len[MAX_GAPS];
	unsigned gaps = 0, skips = 0;
	uint64_t drain_until = 0;
	for (;;) {
		uint64_t now = rte_rdtsc();
		if (!running && drain_until == 0)
			drain_until = now + hz / 5;
		if (drain_until && now > drain_until)
			break;
		if (!drain_until && now >= next) {
			next += interval;
			struct rte_mbuf *m = rte_pktmbuf_alloc(pool);
			if (m) {
				uint8_t *p = rte_pktmbuf_mtod(m, uint8_t *);
				memset(p, 0, 60);
				memcpy(p, &mac1, 6);
				memcpy(p + 6, &mac0, 6);
				p[12] = ETHERTYPE >> 8;
				p[13] = ETHERTYPE & 0xff;
				memcpy(p + 14, &seq, 8);
				m->data_len = m->pkt_len = 60;
				if (rte_eth_tx_burst(0, 0, &m, 1) == 1) {
					seq++;
				} else {
					rte_pktmbuf_free(m);
					if (base != UINT64_MAX)
						refused++;
				}
			}
		}
		struct rte_mbuf *bufs[BURST];
		uint16_t got = rte_eth_rx_burst(1, 0, bufs, BURST);
		for (uint16_t i = 0; i < got; i++) {
			uint8_t *p = rte_pktmbuf_mtod(bufs[i], uint8_t *);
			if (bufs[i]->data_len >= 22 && p[12] == (ETHERTYPE >> 8) &&
			    p[13] == (ETHERTYPE & 0xff)) {
				uint64_t s;
				memcpy(&s, p + 14, 8);
				if (!first_rx)
					first_rx = now;
				if (base == UINT64_MAX && now - first_rx > hz / 2) {
					base = expect = seq;
					last_rx = 0;
				}
				if (s < base) {
					/* warm-up */
				} else if (s < expect) {
					dups++;
				} else {
					if (s > expect && skips < MAX_GAPS) {
						skip_at[skips] = now - start;
						skip_len[skips] = s - expect;
						skips++;
					}
					expect = s + 1;
					received++;
				}
				if (s >= base && last_rx && now - last_rx > gap_min && gaps < MAX_GAPS) {
					gap_at[gaps] = last_rx - start;
					gap_len[gaps] = now - last_rx;
					gaps++;
				}
				if (s >= base)
					last_rx = now;
			}
			rte_pktmbuf_free(bufs[i]);
		}
		/* Port 0 receives nothing of ours; keep its ring empty. */
		got = rte_eth_rx_burst(0, 0, bufs, BURST);
		for (uint16_t i = 0; i < got; i++)
			rte_pktmbuf_free(bufs[i]);
	}
	uint64_t sent = base == UINT64_MAX ? 0 : seq - base;
	uint64_t end = drain_until ? drain_until - hz / 5 : rte_rdtsc();
	/* Frames still arriving in the drain came after `end`. */
	uint64_t quiet = !last_rx ? end : end > last_rx ? end - last_rx : 0;
	printf("quiet %.1f\n", (double)quiet * 1e3 / (double)hz);
	printf("sent %lu received %lu lost %lu duplicated %lu refused %lu\n",
	       (unsigned long)sent, (unsigned long)received,
	       (unsigned long)(sent - received), (unsigned long)dups,
	       (unsigned long)refused);
	for (unsigned i = 0; i < gaps; i++)
		printf("gap %.3f %.1f\n", (double)gap_at[i] * 1e3 / (double)hz,
		       (double)gap_len[i] * 1e6 / (double)hz);
	for (unsigned i = 0; i < skips; i++)
		printf("skip %.3f %lu\n", (double)skip_at[i] * 1e3 / (double)hz,
		       (unsigned long)skip_len[i]);
	fflush(stdout);
	rte_eth_dev_stop(0);
	rte_eth_dev_stop(1);
	rte_eal_cleanup();
	return 0;
}
