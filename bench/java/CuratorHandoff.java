// Curator InterProcessMutex contenders for fencelock-bench's contended handoff: N threads of one
// JVM, each with a CuratorFramework of its own (its own session), contend for one lock.
// Usage: CuratorHandoff CONNECT LOCK_PATH N HANDOFFS WARMUP
// Prints READY once every client is connected; on a line on stdin, runs WARMUP + HANDOFFS
// grants (each holder records its grant and its release, as the Rust contenders do) and prints
// RESULT <handoffs per second> <p50 ns> <p99 ns> <handoffs measured>, then exits.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorHandoff {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        int n = Integer.parseInt(args[2]);
        int handoffs = Integer.parseInt(args[3]);
        int warmup = Integer.parseInt(args[4]);
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100));
            client.start();
            client.blockUntilConnected();
            clients.add(client);
        }
        System.out.println("READY");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();

        // Marks in order: +t a grant at t, -t a release call at t (nanoTime).
        final List<long[]> marks = new ArrayList<>();
        final AtomicInteger grants = new AtomicInteger();
        final int total = warmup + handoffs;
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework client : clients) {
            InterProcessMutex mutex = new InterProcessMutex(client, path);
            Thread thread = new Thread(() -> {
                try {
                    // Bounded: after `total` grants in all, every thread leaves at its turn.
                    while (true) {
                        mutex.acquire();
                        synchronized (marks) { marks.add(new long[] {1, System.nanoTime()}); }
                        boolean last = grants.getAndIncrement() >= total;
                        synchronized (marks) { marks.add(new long[] {0, System.nanoTime()}); }
                        mutex.release();
                        if (last) return;
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) thread.join();

        List<Long> latencies = new ArrayList<>();
        long releasing = -1, first = -1, lastGrant = -1;
        int seen = 0;
        for (long[] mark : marks) {
            if (mark[0] == 0) {
                releasing = mark[1];
            } else if (releasing >= 0) {
                if (seen++ >= warmup) {
                    if (first < 0) first = releasing;
                    latencies.add(mark[1] - releasing);
                    lastGrant = mark[1];
                }
                releasing = -1;
            }
        }
        long[] sorted = latencies.stream().mapToLong(Long::longValue).toArray();
        Arrays.sort(sorted);
        int count = sorted.length;
        double perSecond = count / ((lastGrant - first) / 1e9);
        // As fencelock-bench's percentiles: the sample at round((count - 1) * q).
        long p50 = sorted[(int) Math.round((count - 1) * 0.50)];
        long p99 = sorted[(int) Math.round((count - 1) * 0.99)];
        System.out.println("RESULT " + perSecond + " " + p50 + " " + p99 + " " + count);
        System.out.flush();
        for (CuratorFramework client : clients) client.close();
    }
}
