// A Curator InterProcessSemaphoreV2 contender for fencelock's interoperability test.
// Usage: CuratorSemaphore CONNECT PATH MAX_LEASES; prints WAITING, then ACQUIRED once it holds a
// lease; a line "release" on stdin closes the lease (RELEASED) and exits.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorSemaphore {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, args[1], Integer.parseInt(args[2]));
        System.out.println("WAITING");
        System.out.flush();
        Lease lease = semaphore.acquire();
        System.out.println("ACQUIRED");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        semaphore.returnLease(lease);
        System.out.println("RELEASED");
        System.out.flush();
        client.close();
    }
}
