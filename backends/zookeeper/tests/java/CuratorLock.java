// A Curator InterProcessMutex contender for fencelock's interoperability test.
// Usage: CuratorLock CONNECT LOCK_PATH; prints WAITING, then ACQUIRED <node path>; releases and
// exits when a line arrives on stdin.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Collection;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        System.out.println("WAITING");
        System.out.flush();
        mutex.acquire();
        String mine = null;
        Collection<String> nodes = mutex.getParticipantNodes();
        for (String node : nodes) { mine = node; break; } // sorted: the first is the holder, us
        System.out.println("ACQUIRED " + mine);
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        mutex.release();
        System.out.println("RELEASED");
        System.out.flush();
        client.close();
    }
}
