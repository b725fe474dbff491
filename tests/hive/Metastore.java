// The Hive metastore server (HiveMetaStore.main), stopped when the process that started it is
// gone: nobody writes to our stdin, so end-of-file means the test session has ended, however it
// ended. Run as a single-file program: java -cp JARS tests/hive/Metastore.java -p PORT
public class Metastore {
    public static void main(String[] args) throws Throwable {
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() != -1) { }
            } catch (java.io.IOException ignored) {
            }
            Runtime.getRuntime().halt(0);
        });
        watcher.setDaemon(true);
        watcher.start();
        org.apache.hadoop.hive.metastore.HiveMetaStore.main(args);
    }
}
