/* The pod sandbox's "pause" process: sleeps until SIGTERM or SIGINT, reaps nothing else.
 * Built statically for the hawser.local/pause image (no registry is reachable here). */
#include <signal.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
