// A Curator LeaderLatch participant for fencelock's interoperability test.
// Usage: CuratorLatch CONNECT LATCH_PATH ID [SESSION_TIMEOUT_MS]; starts the latch and prints STARTED, then answers
// one command per stdin line: "await" -> LEADER (once it leads), "has" -> HAS true|false,
// "leader" -> LEADER_ID <id of the current leader>, "close" -> CLOSED (and exits).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.retry.RetryOneTime;

public class CuratorLatch {
    public static void main(String[] args) throws Exception {
        int session = args.length > 3 ? Integer.parseInt(args[3]) : 10000;
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], session, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        LeaderLatch latch = new LeaderLatch(client, args[1], args[2]);
        latch.start();
        System.out.println("STARTED");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String command;
        while ((command = in.readLine()) != null) {
            switch (command) {
                case "await":
                    latch.await();
                    System.out.println("LEADER");
                    break;
                case "has":
                    System.out.println("HAS " + latch.hasLeadership());
                    break;
                case "leader":
                    System.out.println("LEADER_ID " + latch.getLeader().getId());
                    break;
                case "close":
                    latch.close();
                    System.out.println("CLOSED");
                    System.out.flush();
                    client.close();
                    return;
                default:
                    System.out.println("UNKNOWN " + command);
            }
            System.out.flush();
        }
    }
}
