// A single-node Hadoop 3 in one JVM: MiniDFSCluster (NameNode + DataNode) and
// MiniYARNCluster (ResourceManager + NodeManager, whose containers are real processes).
//
// Run by tests/minihadoop.py in Java's source-file mode (no build step):
//   java -cp 'CONF:JARS/*' MiniHadoop.java CONF_DIR [key=value ...]
// in the directory that is to hold the cluster's data (MiniYARNCluster works under ./target).
// Settings come as key=value arguments; minihadoop.nodes.in.process=0 starts the NameNode and
// ResourceManager alone, for nodes of their own (MiniNode.java). Once both clusters are up, the client
// configuration (core-site.xml, hdfs-site.xml, yarn-site.xml) is written to CONF_DIR,
// and then CONF_DIR/ready, which readers wait for. The JVM runs until it is
// terminated (SIGTERM or Ctrl-C) or its standard input ends (the starting process died):
// either way both clusters stop cleanly, YARN's containers first.

import java.io.File;
import java.io.FileOutputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.namenode.NameNode;
import org.apache.hadoop.metrics2.lib.DefaultMetricsSystem;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniHadoop {
  public static void main(String[] args) throws Exception {
    // Nobody writes to our stdin: end-of-file means the process that started us is gone.
    Thread parentWatch = new Thread(() -> {
      try {
        while (System.in.read() != -1) { }
      } catch (java.io.IOException e) {
        // the pipe broke: the starting process is gone as well
      }
      System.exit(0);
    });
    parentWatch.setDaemon(true);
    parentWatch.start();
    File confDir = new File(args[0]);
    Configuration conf = new YarnConfiguration();
    int nodesInProcess = 1;  // a DataNode and a NodeManager here, or none: the nodes run apart
    for (int i = 1; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      if (kv[0].equals("minihadoop.nodes.in.process")) {
        nodesInProcess = Integer.parseInt(kv[1]);
      } else {
        conf.set(kv[0], kv[1]);
      }
    }
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File("dfs").getAbsolutePath());
    // Before any daemon starts: with hadoop.security.authentication=kerberos each logs in from its keytab.
    UserGroupInformation.setConfiguration(conf);

    Runnable stopHdfs;
    if (nodesInProcess > 0) {
      MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).numDataNodes(nodesInProcess).format(true).build();
      dfs.waitActive();
      conf.set("fs.defaultFS", dfs.getFileSystem().getUri().toString());
      stopHdfs = dfs::shutdown;
    } else {  // a NameNode alone (MiniDFSCluster would cap the replication at its own DataNodes: none)
      NameNode nameNode = startNameNode(conf);
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
        + live.get("dfs.namenode.http-address") + "\n");
    System.out.println("MiniHadoop ready: " + live.get("fs.defaultFS") + ", ResourceManager "
        + live.get(YarnConfiguration.RM_ADDRESS));
    Thread.currentThread().join();  // until terminated
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
