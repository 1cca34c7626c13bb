# The libraries of trainrun::images, the image pipeline: libjpeg-turbo (its
# libjpeg API: partial and scaled decode), libspng, OpenCV's imgproc (the
# resizer). Sets TRAINRUN_IMAGE_LIBS_FOUND, and where found defines
# trainrun_image_libs::jpeg, ::spng and ::opencv as imported targets.
include_guard(GLOBAL)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(trainrun_jpeg QUIET IMPORTED_TARGET GLOBAL libjpeg)
  pkg_check_modules(trainrun_spng QUIET IMPORTED_TARGET GLOBAL spng)
endif()
find_path(TRAINRUN_OPENCV_INCLUDE_DIR opencv2/imgproc.hpp PATH_SUFFIXES opencv4)
find_library(TRAINRUN_OPENCV_IMGPROC opencv_imgproc)
find_library(TRAINRUN_OPENCV_CORE opencv_core)
set(TRAINRUN_IMAGE_LIBS_FOUND FALSE)
if(TARGET PkgConfig::trainrun_jpeg AND TARGET PkgConfig::trainrun_spng
   AND TRAINRUN_OPENCV_INCLUDE_DIR AND TRAINRUN_OPENCV_IMGPROC AND TRAINRUN_OPENCV_CORE)
  set(TRAINRUN_IMAGE_LIBS_FOUND TRUE)
  add_library(trainrun_image_libs::jpeg INTERFACE IMPORTED GLOBAL)
  target_link_libraries(trainrun_image_libs::jpeg INTERFACE PkgConfig::trainrun_jpeg)
  add_library(trainrun_image_libs::spng INTERFACE IMPORTED GLOBAL)
  target_link_libraries(trainrun_image_libs::spng INTERFACE PkgConfig::trainrun_spng)
  add_library(trainrun_image_libs::opencv INTERFACE IMPORTED GLOBAL)
  target_include_directories(trainrun_image_libs::opencv INTERFACE ${TRAINRUN_OPENCV_INCLUDE_DIR})
  target_link_libraries(trainrun_image_libs::opencv INTERFACE
    ${TRAINRUN_OPENCV_IMGPROC} ${TRAINRUN_OPENCV_CORE})
endif()
