// A Curator InterProcessReadWriteLock contender for fencelock's interoperability test.
// Usage: CuratorRwLock CONNECT LOCK_PATH read|write; prints WAITING, then
// ACQUIRED <czxid> <node name> once it holds; a line "release" on stdin releases (RELEASED) and
// exits.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.data.Stat;

public class CuratorRwLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, args[1]);
        InterProcessMutex lock;
        switch (args[2]) {
            case "read": lock = rw.readLock(); break;
            case "write": lock = rw.writeLock(); break;
            default: throw new IllegalArgumentException("read or write, not " + args[2]);
        }
        System.out.println("WAITING");
        System.out.flush();
        lock.acquire();
        // Our node's path: InterProcessMutex.getLockPath is protected, so by reflection.
        Method getLockPath = InterProcessMutex.class.getDeclaredMethod("getLockPath");
        getLockPath.setAccessible(true);
        String path = (String) getLockPath.invoke(lock);
        Stat stat = client.checkExists().forPath(path);
        String node = path.substring(path.lastIndexOf('/') + 1);
        System.out.println("ACQUIRED " + stat.getCzxid() + " " + node);
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        lock.release();
        System.out.println("RELEASED");
        System.out.flush();
        client.close();
    }
}
