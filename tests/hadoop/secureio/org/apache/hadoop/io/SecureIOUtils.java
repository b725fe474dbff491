// TEST ONLY: a stand-in for Hadoop's SecureIOUtils in the secured test Hadoop (tests/securehadoop.py),
// compiled by the harness and put before Hadoop's jars on the cluster JVM's classpath alone.
//
// With Kerberos on, Hadoop's SecureIOUtils refuses to load without libhadoop.so ("Secure IO is not
// possible without native code extensions"), which Maven's jars do not carry: the NodeManager could
// then neither aggregate container logs to HDFS nor serve a running container's logs, and `yarn logs`
// and `dbn logs` could not be tried on the secured cluster. The native code checks, after opening a
// file, that its owner is the expected user: on a node shared by many users, a container cannot then
// trick the NodeManager into reading another user's file through a link. The test cluster has one user
// and runs its containers as itself (as `ignore.secure.ports.for.testing` stands in for root's ports),
// so this class opens files without that check; everything else Kerberos guards is Hadoop's own code.

package org.apache.hadoop.io;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

public class SecureIOUtils {
  public static RandomAccessFile openForRandomRead(File f, String mode, String expectedOwner,
                                                   String expectedGroup) throws IOException {
    return new RandomAccessFile(f, mode);
  }

  protected static RandomAccessFile forceSecureOpenForRandomRead(File f, String mode, String expectedOwner,
                                                                 String expectedGroup) throws IOException {
    return openForRandomRead(f, mode, expectedOwner, expectedGroup);
  }

  public static FSDataInputStream openFSDataInputStream(File file, String expectedOwner,
                                                        String expectedGroup) throws IOException {
    return FileSystem.getLocal(new Configuration()).getRaw().open(new Path(file.getAbsolutePath()));
  }

  protected static FSDataInputStream forceSecureOpenFSDataInputStream(File file, String expectedOwner,
                                                                      String expectedGroup) throws IOException {
    return openFSDataInputStream(file, expectedOwner, expectedGroup);
  }

  public static FileInputStream openForRead(File f, String expectedOwner, String expectedGroup)
      throws IOException {
    return new FileInputStream(f);
  }

  protected static FileInputStream forceSecureOpenForRead(File f, String expectedOwner, String expectedGroup)
      throws IOException {
    return openForRead(f, expectedOwner, expectedGroup);
  }

  /** A new file (never an existing one: {@link AlreadyExistsException}) with the given permission bits. */
  public static FileOutputStream createForWrite(File f, int permissions) throws IOException {
    if (!f.createNewFile()) {
      throw new AlreadyExistsException("File " + f + " already exists");
    }
    Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
    PosixFilePermission[] order = PosixFilePermission.values();  // OWNER_READ ... OTHERS_EXECUTE
    for (int i = 0; i < order.length; i++) {
      if ((permissions & (1 << (order.length - 1 - i))) != 0) {
        bits.add(order[i]);
      }
    }
    Files.setPosixFilePermissions(f.toPath(), bits);
    return new FileOutputStream(f);
  }

  public static class AlreadyExistsException extends IOException {
    private static final long serialVersionUID = 1L;

    public AlreadyExistsException(String msg) {
      super(msg);
    }

    public AlreadyExistsException(Throwable cause) {
      super(cause);
    }
  }
}
