# Runs at install time (install(SCRIPT)), when CMAKE_INSTALL_PREFIX is the prefix being
# installed to (cmake --install --prefix), with the variables packaging/CMakeLists.txt set.

# An install directory as an absolute path: relative ones are under the prefix.
function(px_full_path out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

px_full_path(px_unit_dir "${PX_UNIT_DIR}")
px_full_path(px_sysusers_dir "${PX_SYSUSERS_DIR}")
px_full_path(px_sbin_dir "${PX_SBINDIR}")
# As GNUInstallDirs: the prefix /usr keeps its configuration in /etc, /opt/X in /etc/opt/X.
if(IS_ABSOLUTE "${PX_SYSCONFDIR}")
  set(px_sysconf_dir "${PX_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX STREQUAL "/usr" AND PX_SYSCONFDIR STREQUAL "etc")
  set(px_sysconf_dir "/etc")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/opt/" AND PX_SYSCONFDIR STREQUAL "etc")
  set(px_sysconf_dir "/etc${CMAKE_INSTALL_PREFIX}")
else()
  set(px_sysconf_dir "${CMAKE_INSTALL_PREFIX}/${PX_SYSCONFDIR}")
endif()

set(PX_SBINDIR "${px_sbin_dir}")
set(PX_CONFIG_FILE "${px_sysconf_dir}/parallax/parallaxd.toml")
configure_file("${PX_PACKAGING_DIR}/parallaxd.service.in"
               "${PX_PACKAGING_BINARY_DIR}/parallaxd.service" @ONLY)
file(INSTALL "${PX_PACKAGING_BINARY_DIR}/parallaxd.service"
     DESTINATION "$ENV{DESTDIR}${px_unit_dir}")
file(INSTALL "${PX_PACKAGING_DIR}/parallax.sysusers" DESTINATION "$ENV{DESTDIR}${px_sysusers_dir}"
     RENAME parallax.conf)

# Configuration the operator may have edited is never replaced.
function(px_install_config source dir name)
  if(EXISTS "$ENV{DESTDIR}${dir}/${name}")
    message(STATUS "Keeping: $ENV{DESTDIR}${dir}/${name} (the new one: ${source})")
  else()
    file(INSTALL "${source}" DESTINATION "$ENV{DESTDIR}${dir}" RENAME "${name}")
  endif()
endfunction()
px_install_config("${PX_PACKAGING_DIR}/parallaxd.toml" "${px_sysconf_dir}/parallax" parallaxd.toml)
px_install_config("${PX_PACKAGING_DIR}/parallaxd.logrotate" "${px_sysconf_dir}/logrotate.d"
                  parallaxd)
