// A single-node Hadoop 3 in one JVM: MiniDFSCluster (NameNode + DataNode) and
// MiniYARNCluster (ResourceManager + NodeManager, whose containers are real processes).
//
// Run by tests/minihadoop.py in Java's source-file mode (no build step):
//   java -cp 'CONF:JARS/*' MiniHadoop.java CONF_DIR [key=value ...]
// in the directory that is to hold the cluster's data (MiniYARNCluster works under ./target).
// Settings come as key=value arguments; minihadoop.nodes.in.process=0 starts the NameNode and
// ResourceManager alone, for nodes of their own (MiniNode.java); minihadoop.ha.nameservice=NAME makes
// HDFS highly available: a name service NAME of two NameNodes, nn1 active and nn2 standby, sharing
// their edits, which clients reach as hdfs://NAME. Once both clusters are up, the client
// configuration (core-site.xml, hdfs-site.xml, yarn-site.xml) is written to CONF_DIR,
// and then CONF_DIR/ready, which readers wait for. Standard input takes commands, one a line:
//   fail over   the active NameNode steps down to standby, the standby becomes active, then the
//               old active is stopped: an administrator's `hdfs haadmin -failover` followed by the
//               old active's loss (once: no standby is left)
// The JVM runs until it is terminated (SIGTERM or Ctrl-C) or its standard input ends (the starting
// process died): either way both clusters stop cleanly, YARN's containers first.

import java.io.BufferedReader;
import java.io.File;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.MiniDFSNNTopology;
import org.apache.hadoop.hdfs.server.namenode.NameNode;
import org.apache.hadoop.metrics2.lib.DefaultMetricsSystem;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniHadoop {
  // What the "fail over" command works on: set once HDFS is highly available; the active NameNode's index.
  static volatile MiniDFSCluster haCluster;
  static int active = 0;
  static boolean standbyStopped = false;  // after a fail over: the other NameNode is the stopped old active

  public static void main(String[] args) throws Exception {
    // Nobody but the starting process writes to our stdin: end-of-file means it is gone.
    Thread commands = new Thread(() -> {
      try {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
          try {
            command(line.trim());
          } catch (Exception e) {  // said, and the cluster goes on as it is
            e.printStackTrace();
            System.out.println("MiniHadoop: " + line.trim() + ": failed: " + e);
          }
        }
      } catch (java.io.IOException e) {
        // the pipe broke: the starting process is gone as well
      }
      System.exit(0);
    });
    commands.setDaemon(true);
    commands.start();
    File confDir = new File(args[0]);
    Configuration conf = new YarnConfiguration();
    int nodesInProcess = 1;  // a DataNode and a NodeManager here, or none: the nodes run apart
    String nameService = null;  // HDFS highly available under this name, or a single NameNode
    for (int i = 1; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      if (kv[0].equals("minihadoop.nodes.in.process")) {
        nodesInProcess = Integer.parseInt(kv[1]);
      } else if (kv[0].equals("minihadoop.ha.nameservice")) {
        nameService = kv[1];
      } else {
        conf.set(kv[0], kv[1]);
      }
    }
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File("dfs").getAbsolutePath());
    // Before any daemon starts: with hadoop.security.authentication=kerberos each logs in from its keytab.
    UserGroupInformation.setConfiguration(conf);

    Runnable stopHdfs;
    String nameNodeHttp;
    if (nameService != null) {
      MiniDFSCluster dfs = startHighlyAvailable(conf, nameService, nodesInProcess);
      nameNodeHttp = "localhost:" + dfs.getNameNode(0).getHttpAddress().getPort();
      stopHdfs = dfs::shutdown;
    } else if (nodesInProcess > 0) {
      MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).numDataNodes(nodesInProcess).format(true).build();
      dfs.waitActive();
      conf.set("fs.defaultFS", dfs.getFileSystem().getUri().toString());
      nameNodeHttp = null;
      stopHdfs = dfs::shutdown;
    } else {  // a NameNode alone (MiniDFSCluster would cap the replication at its own DataNodes: none)
      NameNode nameNode = startNameNode(conf);
      nameNodeHttp = null;
      stopHdfs = nameNode::stop;
    }
    // Users' home directories: skein stages each application under ~/.skein. On a Kerberos cluster the
    // daemons, and this file system, are a service principal: the home is that of this JVM's OS user.
    FileSystem fs = FileSystem.get(conf);
    String user = UserGroupInformation.isSecurityEnabled() ? System.getProperty("user.name")
        : UserGroupInformation.getCurrentUser().getShortUserName();
    fs.mkdirs(new Path("/user/" + user));
    fs.setOwner(new Path("/user/" + user), user, null);
    fs.mkdirs(new Path("/tmp/logs"));
    fs.setPermission(new Path("/tmp"), new org.apache.hadoop.fs.permission.FsPermission((short) 01777));
    fs.setPermission(new Path("/tmp/logs"), new org.apache.hadoop.fs.permission.FsPermission((short) 01777));

    MiniYARNCluster yarn = new MiniYARNCluster("dbn-yarn", 1, nodesInProcess, 1, 1);
    yarn.init(conf);
    yarn.start();
    if (!yarn.waitForNodeManagersToConnect(60000)) {
      throw new IllegalStateException("the NodeManager did not register with the ResourceManager in 60 s");
    }
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      yarn.stop();
      stopHdfs.run();
    }));

    // The ResourceManager's configuration now holds every address actually bound.
    Configuration live = yarn.getConfig();
    confDir.mkdirs();
    for (String name : new String[] {"core-site.xml", "hdfs-site.xml", "yarn-site.xml"}) {
      File tmp = new File(confDir, name + ".tmp");
      try (OutputStream out = new FileOutputStream(tmp)) {
        live.writeXml(out);
      }
      Files.move(tmp.toPath(), new File(confDir, name).toPath(), StandardCopyOption.REPLACE_EXISTING);
    }
    Files.writeString(new File(confDir, "ready").toPath(), live.get("fs.defaultFS") + "\n"
        + live.get(YarnConfiguration.RM_ADDRESS) + "\n" + live.get(YarnConfiguration.RM_WEBAPP_ADDRESS) + "\n"
        + (nameNodeHttp != null ? nameNodeHttp : live.get("dfs.namenode.http-address")) + "\n");
    System.out.println("MiniHadoop ready: " + live.get("fs.defaultFS") + ", ResourceManager "
        + live.get(YarnConfiguration.RM_ADDRESS));
    Thread.currentThread().join();  // until terminated
  }

  // HDFS as the name service `name`: NameNodes nn1 (active) and nn2 (standby) sharing their edits, and
  // `dataNodes` DataNodes reporting to both. conf gets what a client needs to reach the service
  // (its NameNodes' addresses, the failover proxy) and fs.defaultFS hdfs://name.
  static MiniDFSCluster startHighlyAvailable(Configuration conf, String name, int dataNodes) throws Exception {
    conf.setInt("dfs.ha.tail-edits.period", 1);  // the standby follows the active's edits within a second
    MiniDFSNNTopology topology = new MiniDFSNNTopology().addNameservice(new MiniDFSNNTopology.NSConf(name)
        .addNN(new MiniDFSNNTopology.NNConf("nn1")).addNN(new MiniDFSNNTopology.NNConf("nn2")));
    MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).nnTopology(topology).numDataNodes(dataNodes)
        .format(true).build();
    dfs.waitActive();
    dfs.transitionToActive(0);
    conf.set("dfs.nameservices", name);
    conf.set("dfs.ha.namenodes." + name, "nn1,nn2");
    for (int i = 0; i < 2; i++) {
      NameNode nameNode = dfs.getNameNode(i);
      conf.set("dfs.namenode.rpc-address." + name + ".nn" + (i + 1),
               "localhost:" + nameNode.getNameNodeAddress().getPort());
      conf.set("dfs.namenode.http-address." + name + ".nn" + (i + 1),
               "localhost:" + nameNode.getHttpAddress().getPort());
    }
    conf.set("dfs.client.failover.proxy.provider." + name,
             "org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider");
    conf.set("fs.defaultFS", "hdfs://" + name);
    haCluster = dfs;
    return dfs;
  }

  // One command read from standard input (see the top of this file).
  static void command(String line) throws Exception {
    if (line.equals("fail over") && haCluster != null) {
      int next = 1 - active;
      if (standbyStopped) {
        // A stopped NameNode restarted as a standby never had the DataNodes register again here
        // (2026-12-08: "incremental block report from unregistered node"): one fail over a cluster.
        throw new IllegalStateException("no standby NameNode left: an earlier fail over stopped it");
      }
      haCluster.transitionToStandby(active);
      haCluster.transitionToActive(next);
      haCluster.shutdownNameNode(active);
      active = next;
      standbyStopped = true;
    } else {
      System.out.println("MiniHadoop: unknown command or HDFS not highly available: " + line);
      return;
    }
    System.out.println("MiniHadoop: " + line + ": done");
  }

  // A formatted, fresh NameNode on free ports of localhost, out of safe mode; conf gets its addresses.
  static NameNode startNameNode(Configuration conf) throws Exception {
    conf.set("dfs.namenode.name.dir", new File("dfs/name").getAbsolutePath());
    conf.set("fs.defaultFS", "hdfs://localhost:0");
    conf.set("dfs.namenode.rpc-address", "localhost:0");
    conf.set("dfs.namenode.http-address", "localhost:0");
    conf.setInt("dfs.namenode.safemode.extension", 0);
    DefaultMetricsSystem.setMiniClusterMode(true);  // formatting registers the metrics the NameNode will again
    NameNode.format(conf);
    NameNode nameNode = NameNode.createNameNode(new String[0], conf);
    String rpc = "localhost:" + nameNode.getNameNodeAddress().getPort();
    conf.set("fs.defaultFS", "hdfs://" + rpc);
    conf.set("dfs.namenode.rpc-address", rpc);
    conf.set("dfs.namenode.http-address", "localhost:" + nameNode.getHttpAddress().getPort());
    return nameNode;
  }
}
