// One worker node of a multi-node MiniHadoop: a DataNode and a NodeManager in one JVM, both on
// the node's own loopback address (127.0.0.2, 127.0.0.3, ...), so HDFS and YARN see as many
// hosts as there are nodes, and losing a node is losing this process.
//
// Run by tests/minihadoop.py in Java's source-file mode, once the cluster's NameNode and
// ResourceManager are up (their client configuration is on the classpath):
//   java -cp 'NODE_CONF:CONF:JARS/*' MiniNode.java ADDRESS NODE_DIR [key=value ...]
// NODE_CONF holds this node's own node-resources.xml (its yarn.io/gpu units). Once both daemons
// have started, NODE_DIR/ready is written. Standard input takes commands, one a line:
//   stop datanode      the DataNode stops (the NodeManager goes on)
//   stop nodemanager   the NodeManager stops, its containers with it, and leaves the cluster
//   start datanode, start nodemanager   a stopped one starts again (the DataNode with its blocks)
// End of input (the starting process died or closed it) stops both and exits.

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.file.Files;

import javax.net.SocketFactory;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.server.datanode.DataNode;
import org.apache.hadoop.metrics2.lib.DefaultMetricsSystem;
import org.apache.hadoop.net.StandardSocketFactory;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;

public class MiniNode {
  static String address;

  static DataNode startDataNode(Configuration conf) throws IOException {
    return DataNode.createDataNode(new String[0], new HdfsConfiguration(conf));
  }

  static NodeManager startNodeManager(Configuration conf) {
    NodeManager nodeManager = new NodeManager();
    nodeManager.init(new YarnConfiguration(conf));
    nodeManager.start();
    return nodeManager;
  }

  // Hadoop's RPC connections from this node leave from the node's address: the NameNode takes a
  // DataNode's IP from the connection it registers on, and 127.0.0.1 would make every node one host.
  public static class NodeSocketFactory extends StandardSocketFactory {
    @Override
    public Socket createSocket() throws IOException {
      Socket socket = super.createSocket();
      socket.bind(new InetSocketAddress(address, 0));
      return socket;
    }
  }

  public static void main(String[] args) {
    try {
      run(args);
    } catch (Throwable e) {  // a daemon that failed to start: the node is down, not half up
      e.printStackTrace();
      System.exit(1);
    }
    System.exit(0);
  }

  static void run(String[] args) throws Exception {
    address = args[0];
    File nodeDir = new File(args[1]);
    // Hadoop resolves the socket factory by name through the context class loader: this file's classes.
    Thread.currentThread().setContextClassLoader(MiniNode.class.getClassLoader());
    // A DataNode and a NodeManager in one JVM both register JVM metrics, as in Hadoop's own mini clusters.
    DefaultMetricsSystem.setMiniClusterMode(true);
    Configuration conf = new YarnConfiguration(new HdfsConfiguration());
    conf.setClassLoader(MiniNode.class.getClassLoader());
    for (int i = 2; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      conf.set(kv[0], kv[1]);
    }
    conf.setClass("hadoop.rpc.socket.factory.class.default", NodeSocketFactory.class, SocketFactory.class);
    for (String key : new String[] {"dfs.datanode.address", "dfs.datanode.http.address", "dfs.datanode.ipc.address",
                                    "dfs.datanode.https.address", "yarn.nodemanager.address",
                                    "yarn.nodemanager.localizer.address", "yarn.nodemanager.webapp.address"}) {
      conf.set(key, address + ":0");
    }
    conf.set("dfs.datanode.hostname", address);
    conf.set("yarn.nodemanager.hostname", address);
    conf.set("dfs.datanode.data.dir", new File(nodeDir, "data").getAbsolutePath());
    conf.set("yarn.nodemanager.local-dirs", new File(nodeDir, "nm-local").getAbsolutePath());
    conf.set("yarn.nodemanager.log-dirs", new File(nodeDir, "nm-logs").getAbsolutePath());

    DataNode[] dataNode = {startDataNode(conf)};
    NodeManager[] nodeManager = {startNodeManager(conf)};
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      synchronized (MiniNode.class) {
        if (nodeManager[0] != null) nodeManager[0].stop();
        if (dataNode[0] != null) dataNode[0].shutdown();
      }
    }));
    Files.writeString(new File(nodeDir, "ready").toPath(), address + "\n");
    System.out.println("MiniNode ready: " + address);

    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null; ) {
      synchronized (MiniNode.class) {  // (a command that throws ends the node: main exits with 1)
        if (line.equals("stop datanode") && dataNode[0] != null) {
          dataNode[0].shutdown();
          dataNode[0] = null;
        } else if (line.equals("stop nodemanager") && nodeManager[0] != null) {
          nodeManager[0].stop();
          nodeManager[0] = null;
        } else if (line.equals("start datanode") && dataNode[0] == null) {
          dataNode[0] = startDataNode(conf);
        } else if (line.equals("start nodemanager") && nodeManager[0] == null) {
          nodeManager[0] = startNodeManager(conf);
        } else {
          System.out.println("MiniNode: unknown or repeated command: " + line);
          continue;
        }
      }
      System.out.println("MiniNode " + address + ": " + line + ": done");
    }
  }
}
